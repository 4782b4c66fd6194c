-- One step of a fair batch that takes the rows pinned to the claiming
-- worker (sticky_worker = p_worker, pin running, due) in one go, in the
-- order as many single claims would take them (harvest_pick_sticky first
-- in each), with the lags they would report and the charges they would
-- make; or none, when this step needs the single claim. The caller holds
-- the queue's fair lock, has folded its arrivals, and knows the queue is
-- one-level, charged per claim, without ageing (the single claim serves
-- the other shapes).
--
-- Why a plan can be computed at once: among pinned rows of the top
-- priority the single claim takes the row whose key has the smallest
-- start tag max(pass, V), then by the row (band, due time, id); taking it
-- charges its key a step of cost / w and leaves the other keys' tags as
-- they were. So the claims follow the merge of each key's pinned rows in
-- its order, tagged t, t + 1/w, t + 1/w + 1/w, ... (the running sum the
-- single charge makes, in the same float order), as the fair bulk step
-- merges the key heads (harvest_claim_bulk_fair says why the tags are
-- exact). Rows of a lower priority wait for the next step, since the
-- clock the first ones move changes their keys' tags.
--
-- The plan stops before the first row the single claim would treat
-- differently: a row with a quota key (its recheck may refuse it), a row
-- of a key without fairness state (its charge creates the state), a row
-- another transaction holds (the pick skips it) or that is no longer
-- pending and pinned. The caller's next step starts there. A key's head
-- moves on, after the leases, from where it was when one of the rows
-- taken was the head (harvest_charge moves a head only then).
CREATE OR REPLACE FUNCTION harvest_claim_bulk_sticky(p_queue text, p_worker text, p_now timestamptz,
                                                     p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- The generic plans are made once per connection, from the statistics of
-- that moment. Made on a small shard, both the plan and the lock read the
-- worker's pinned rows by a sequential scan of tasks, and went on doing so
-- over the whole history as the shard grew, until an analyze made them
-- again. Under the claim's entry points, which rule sequential scans out
-- (harvest_claim_batch), the pinned rows come from their partial index and
-- the lock's rows by id, whatever the statistics
-- (TestClaimPlansOutliveTheShardsGrowth).
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_clock0  double precision := harvest_clock(p_queue);
    v_clock   double precision;
    v_ids     bigint[];
    v_keys    text[];
    v_tags    double precision[];
    v_stop    integer;
    v_locked  bigint[];
    v_k       integer;
    v_i       integer;
    r_key     record;
    r_head    record;
BEGIN
    -- The plan: the top priority's pinned rows, each key's rows tagged by
    -- the running sum from its start tag, merged; cut at p_n rows.
    WITH pinned AS (
        SELECT x.id, x.fairness_key, x.priority, x.continuation, x.due_at, x.quota_key
        FROM tasks x
        WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
          AND x.sticky_until > v_now AND x.due_at <= v_due_cut
    ), top AS (
        SELECT p.* FROM pinned p WHERE p.priority = (SELECT max(priority) FROM pinned)
    ), keyed AS MATERIALIZED (
        -- Once per key (materialized: inlined, the planner read the key's
        -- state and charge terms again for every pinned row).
        SELECT k.key, f.key IS NOT NULL AS known, harvest_start_tag(f.pass, v_clock0) AS t, c.step AS inc
        FROM (SELECT DISTINCT top.fairness_key AS key FROM top) k
        LEFT JOIN fair_state f ON f.queue = p_queue AND f.key = k.key
        CROSS JOIN LATERAL harvest_charge_terms(p_queue, k.key, false) c
    ), numbered AS (
        SELECT top.*, row_number() OVER (PARTITION BY top.fairness_key
                                         ORDER BY top.continuation DESC, top.due_at, top.id) AS o
        FROM top
    ), tagged AS (
        SELECT n.id, n.fairness_key, n.quota_key, keyed.known, n.continuation, n.due_at,
               sum(CASE WHEN n.o = 1 THEN keyed.t ELSE keyed.inc END)
                   OVER (PARTITION BY n.fairness_key ORDER BY n.o ROWS UNBOUNDED PRECEDING) AS tag
        FROM numbered n
        JOIN keyed ON keyed.key = n.fairness_key
        -- A key's rows past its p_n-th cannot be among the first p_n of
        -- the merge, and dropping them leaves the running sums of the
        -- others as they were: the plan's cost follows the rows it can
        -- take, not the worker's whole pinned backlog.
        WHERE n.o <= p_n
    ), ordered AS (
        SELECT t.*, row_number() OVER (ORDER BY t.tag, t.continuation DESC, t.due_at, t.id) AS seq
        FROM tagged t
    )
    SELECT array_agg(o.id ORDER BY o.seq), array_agg(o.fairness_key ORDER BY o.seq),
           array_agg(o.tag ORDER BY o.seq),
           min(o.seq) FILTER (WHERE o.quota_key <> '' OR NOT o.known)
    INTO v_ids, v_keys, v_tags, v_stop
    FROM ordered o WHERE o.seq <= p_n;
    v_k := least(coalesce(cardinality(v_ids), 0), coalesce(v_stop - 1, p_n));
    IF v_k <= 0 THEN
        RETURN;
    END IF;

    -- Lock the plan's rows as the single picks would (skipping held ones);
    -- the plan ends before the first that is not locked here.
    v_locked := ARRAY(
        SELECT x.id FROM tasks x
        WHERE x.id = ANY (v_ids[1:v_k]) AND x.queue = p_queue AND x.state = 'pending'
          AND x.sticky_worker = p_worker AND x.sticky_until > v_now AND x.due_at <= v_due_cut
        ORDER BY x.id
        FOR UPDATE SKIP LOCKED);
    FOR v_i IN 1..v_k LOOP
        IF NOT (v_ids[v_i] = ANY (v_locked)) THEN
            v_k := v_i - 1;
            EXIT;
        END IF;
    END LOOP;
    IF v_k = 0 THEN
        RETURN;
    END IF;
    v_ids := v_ids[1:v_k];
    v_keys := v_keys[1:v_k];
    v_tags := v_tags[1:v_k];
    v_clock := greatest(v_clock0, v_tags[v_k]);

    -- Lease the rows; each reports the lag its single claim would: its tag
    -- over the clock before it.
    RETURN QUERY SELECT * FROM harvest_lease_rows(v_ids, ARRAY(
        SELECT p.tag - greatest(v_clock0, coalesce(lag(p.tag) OVER (ORDER BY p.ord), v_clock0))
        FROM unnest(v_tags) WITH ORDINALITY AS p(tag, ord) ORDER BY p.ord), p_worker, p_lease);

    -- Each key's last claim sets its state; a head taken moves on.
    FOR r_key IN
        SELECT DISTINCT ON (p.key) p.key, p.tag, c.step AS inc, f.head_id, f.head_prio, f.head_cont, f.head_due,
               f.head_id = ANY (v_ids) AS head_taken
        FROM unnest(v_keys, v_tags) WITH ORDINALITY AS p(key, tag, ord)
        JOIN fair_state f ON f.queue = p_queue AND f.key = p.key
        CROSS JOIN LATERAL harvest_charge_terms(p_queue, p.key, false) c
        ORDER BY p.key, p.ord DESC
    LOOP
        IF r_key.head_taken THEN
            SELECT * INTO r_head FROM harvest_key_head(p_queue, r_key.key, r_key.head_prio, r_key.head_cont,
                                                       r_key.head_due, r_key.head_id);
            UPDATE fair_state SET
                last_start = r_key.tag,
                pass       = r_key.tag + r_key.inc,
                charged_at = v_now,
                in_debt    = true,
                head_id    = r_head.head_id,
                head_prio  = r_head.head_prio,
                head_cont  = r_head.head_cont,
                head_due   = r_head.head_due
            WHERE queue = p_queue AND key = r_key.key;
        ELSE
            UPDATE fair_state SET
                last_start = r_key.tag,
                pass       = r_key.tag + r_key.inc,
                charged_at = v_now,
                in_debt    = true
            WHERE queue = p_queue AND key = r_key.key;
        END IF;
    END LOOP;
    -- The charged keys are in debt; every key the new clock reached is not.
    IF v_clock > v_clock0 THEN
        PERFORM harvest_clock_advance(p_queue, v_clock);
    END IF;
END
$$;
