-- One fair bulk step of a batch: up to p_n rows in the order as many single
-- fair claims would take them, with the lags they would report and the
-- charges they would make, or none when this step needs the single claim.
-- The caller holds the queue's fair lock, has folded its arrivals, and
-- checked that there is no ageing and no row pinned to the worker. In a
-- queue charged by runtime (p_runtime) each claim bills the key's held
-- estimate instead of 1 (1 s until one of its attempts has ended), the
-- same for all its rows of the step since estimates move only when the
-- held time is folded, before the step; so a key's increment is the step
-- of harvest_charge_terms (cost / w) throughout, read once from the
-- function the single claim reads it from.
--
-- Why a plan can be computed at once: among keys whose heads share the top
-- priority, the single claim always takes the key with the smallest start
-- tag max(pass, V), and taking it leaves every other key's tag as it was
-- (their tags are at least the one taken, which becomes V). So the claims
-- follow the merge of each key's tags t, t + 1/w, t + 1/w + 1/w, ... (the
-- running sum the single charge makes, in the same float order), ties
-- broken by the rows (band, due time, id). The step:
--   1. takes the best p_n keys of the top priority from the two key
--      indexes (no debt: tag V; in debt: tag pass), merged by (tag, head).
--      No other key can take one of the next p_n claims: the first claims
--      of these p_n keys all come before its first;
--   2. reads some rows of each candidate from its head (a share of p_n by
--      weight, more when that was too few) among its rows of the top
--      priority, in the key's order, and merges their tags;
--   3. keeps the plan up to the first claim that could differ from the
--      single claims: one at or after the next tag of a key read to its
--      share (it may have more rows), or a row with a quota key (its
--      rechecks are the single claim's). A key read short has no other
--      row of the top priority, so its next claim comes after all of them
--      and ends nothing; the caller's next bulk step takes the next
--      priority;
--   4. locks the rows of the plan (waiting, as the single fair claim does;
--      a row that left the pending state or moved meanwhile ends the plan
--      before it), leases them, and writes each key's charges and new head
--      once, the clock, and the debt marks.
DROP FUNCTION IF EXISTS harvest_claim_bulk_fair(text, text, timestamptz, interval, integer);
CREATE OR REPLACE FUNCTION harvest_claim_bulk_fair(p_queue text, p_worker text, p_now timestamptz,
                                                   p_lease interval, p_n integer, p_runtime boolean)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
-- The statements below are shaped for their indexes whatever the values;
-- planning them anew on every call cost more than running them.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_clock0  double precision := harvest_clock(p_queue);
    v_clock   double precision;
    v_prio    integer;
    v_keys    text[];
    v_t       double precision[];
    v_w       double precision[];
    v_cost    double precision[];
    v_inc     double precision[];
    v_secs    double precision[];
    v_hc      boolean[];
    v_hd      timestamptz[];
    v_hi      bigint[];
    v_cnt     integer[];
    v_sumw    double precision;
    v_ids     bigint[];
    v_pkeys   text[];
    v_tags    double precision[];
    v_conts   boolean[];
    v_dues    timestamptz[];
    v_nkeys   text[];
    v_nids    bigint[];
    v_nconts  boolean[];
    v_ndues   timestamptz[];
    v_short   text[];
    v_locked  bigint[];
    v_k       integer;
    v_i       integer;
    v_hp      integer[];
    r_head    record;
BEGIN
    -- 1. The candidates.
    WITH u AS (
        (SELECT f.key, v_clock0 AS t, f.head_prio, f.head_cont, f.head_due, f.head_id FROM fair_state f
         WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND NOT f.in_debt
         ORDER BY f.head_prio DESC, f.head_cont DESC, f.head_due, f.head_id LIMIT p_n)
        UNION ALL
        (SELECT f.key, harvest_start_tag(f.pass, v_clock0), f.head_prio, f.head_cont, f.head_due, f.head_id FROM fair_state f
         WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.in_debt
         ORDER BY f.head_prio DESC, f.pass, f.head_cont DESC, f.head_due, f.head_id LIMIT p_n)
    ), top AS (
        SELECT u.*, row_number() OVER (ORDER BY u.t, u.head_cont DESC, u.head_due, u.head_id) AS r
        FROM u WHERE u.head_prio = (SELECT max(head_prio) FROM u)
    ), ranked AS (
        SELECT top.*, c.weight AS w, c.cost, c.step AS inc
        FROM top CROSS JOIN LATERAL harvest_charge_terms(p_queue, top.key, p_runtime) c
        WHERE top.r <= p_n
    )
    SELECT max(head_prio), array_agg(key ORDER BY r), array_agg(t ORDER BY r), array_agg(w ORDER BY r),
           array_agg(cost ORDER BY r), array_agg(inc ORDER BY r),
           array_agg(head_cont ORDER BY r), array_agg(head_due ORDER BY r), array_agg(head_id ORDER BY r), sum(w / cost)
    INTO v_prio, v_keys, v_t, v_w, v_cost, v_inc, v_hc, v_hd, v_hi, v_sumw
    FROM ranked;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;

    -- 2, 3. Read rows, merge their tags, and cut the plan where it could
    -- differ from single claims. A key whose rows all went into the plan
    -- before it stopped short is read again with twice as many.
    v_cnt := array_fill(0, ARRAY[cardinality(v_keys)]);
    FOR v_i IN 1..cardinality(v_keys) LOOP
        v_cnt[v_i] := least(p_n, ceil(p_n * (v_w[v_i] / v_cost[v_i]) / v_sumw)::integer + 1);
    END LOOP;
    LOOP
        WITH c AS (
            SELECT * FROM unnest(v_keys, v_t, v_inc, v_hc, v_hd, v_hi, v_cnt)
                          AS c(key, t, inc, hc, hd, hi, cnt)
        ), rows AS (
            SELECT c.key, c.inc, c.cnt, x.id, x.continuation, x.due_at, x.quota_key, x.o,
                   sum(CASE WHEN x.o = 1 THEN c.t ELSE c.inc END)
                       OVER (PARTITION BY c.key ORDER BY x.o ROWS UNBOUNDED PRECEDING) AS tag,
                   count(*) OVER (PARTITION BY c.key) AS got
            FROM c CROSS JOIN LATERAL (
                -- The key's rows of the top priority in its order: the
                -- head's band from the head on, then, when the head is a
                -- continuation, the other band from its start (the key's
                -- index cannot seek past the head across bands in one go).
                SELECT z.id, z.continuation, z.due_at, z.quota_key,
                       row_number() OVER (ORDER BY z.continuation DESC, z.due_at, z.id) AS o
                FROM ((SELECT y.id, y.continuation, y.due_at, y.quota_key FROM tasks y
                       WHERE y.queue = p_queue AND y.fairness_key = c.key AND y.state = 'pending'
                         AND y.priority = v_prio AND y.continuation = c.hc AND (y.due_at, y.id) >= (c.hd, c.hi)
                         AND y.due_at <= v_due_cut
                       ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                       LIMIT c.cnt)
                      UNION ALL
                      (SELECT y.id, y.continuation, y.due_at, y.quota_key FROM tasks y
                       WHERE c.hc AND y.queue = p_queue AND y.fairness_key = c.key AND y.state = 'pending'
                         AND y.priority = v_prio AND NOT y.continuation
                         AND y.due_at <= v_due_cut
                       ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                       LIMIT c.cnt)
                      ORDER BY 2 DESC, 3, 1
                      LIMIT c.cnt) z) x
        ), cut AS (
            -- The first claim whose row was not read: each key's next tag
            -- after its last row read, when it was read to its count (it
            -- may have more rows), or the tag of a key of which no row was
            -- read (a stale head). A key read short has no other pending
            -- row of the top priority: its next claim, if any, comes after
            -- every claim of that priority, so it cuts nothing.
            SELECT least((SELECT min(r.tag + r.inc) FROM rows r WHERE r.o = r.got AND r.got = r.cnt),
                         (SELECT min(c.t) FROM c WHERE NOT EXISTS (SELECT 1 FROM rows r WHERE r.key = c.key))) AS tag
        ), ordered AS (
            SELECT r.*, row_number() OVER (ORDER BY r.tag, r.continuation DESC, r.due_at, r.id) AS seq
            FROM rows r
        ), planned AS (
            SELECT o.* FROM ordered o, cut
            WHERE o.seq <= p_n
              AND (cut.tag IS NULL OR o.tag < cut.tag)
              AND o.seq < coalesce((SELECT min(q.seq) FROM ordered q WHERE q.quota_key <> ''), p_n + 1)
        ), last AS (
            -- Each planned key's next row, when it was read: its new head.
            SELECT DISTINCT ON (p.key) p.key, n.id, n.continuation, n.due_at
            FROM planned p LEFT JOIN rows n ON n.key = p.key AND n.o = p.o + 1
            ORDER BY p.key, p.o DESC
        )
        SELECT (SELECT array_agg(p.id ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(p.key ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(p.tag ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(p.continuation ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(p.due_at ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(DISTINCT r.key) FROM rows r, cut
                WHERE r.o = r.got AND r.got = r.cnt AND r.cnt < p_n
                  AND r.tag + r.inc <= cut.tag),
               (SELECT array_agg(l.key) FROM last l), (SELECT array_agg(l.id) FROM last l),
               (SELECT array_agg(l.continuation) FROM last l), (SELECT array_agg(l.due_at) FROM last l)
        INTO v_ids, v_pkeys, v_tags, v_conts, v_dues, v_short, v_nkeys, v_nids, v_nconts, v_ndues;
        v_k := coalesce(cardinality(v_ids), 0);
        EXIT WHEN v_k >= p_n OR v_short IS NULL;
        FOR v_i IN 1..cardinality(v_keys) LOOP
            IF v_keys[v_i] = ANY (v_short) THEN
                v_cnt[v_i] := least(p_n, v_cnt[v_i] * 2);
            END IF;
        END LOOP;
    END LOOP;
    IF v_k = 0 THEN
        RETURN;
    END IF;

    -- 4. Lock the plan's rows; one that left the pending state or moved
    -- meanwhile ends the plan before it.
    SELECT array_agg(x.id) INTO v_locked FROM (
        SELECT t.id FROM tasks t
        JOIN unnest(v_ids, v_pkeys, v_conts, v_dues) AS p(id, key, cont, due) ON p.id = t.id
        WHERE t.state = 'pending' AND t.queue = p_queue AND t.fairness_key = p.key AND t.priority = v_prio
          AND t.continuation = p.cont AND t.due_at = p.due
        ORDER BY t.id FOR UPDATE OF t) x;
    FOR v_i IN 1..v_k LOOP
        IF v_locked IS NULL OR NOT (v_ids[v_i] = ANY (v_locked)) THEN
            v_k := v_i - 1;
            -- The rows read after each key's last claim no longer follow
            -- the plan: look the new heads up instead.
            v_nkeys := NULL;
            EXIT;
        END IF;
    END LOOP;
    IF v_k = 0 THEN
        RETURN;
    END IF;
    v_ids := v_ids[1:v_k];
    v_pkeys := v_pkeys[1:v_k];
    v_tags := v_tags[1:v_k];
    v_conts := v_conts[1:v_k];
    v_dues := v_dues[1:v_k];
    v_clock := greatest(v_clock0, v_tags[v_k]);

    -- Lease the rows and mark their runs running; each row reports the lag
    -- its single claim would: its tag over the clock before it.
    IF p_runtime THEN
        v_secs := ARRAY(SELECT c.cost FROM unnest(v_pkeys) WITH ORDINALITY AS p(key, ord)
                        JOIN unnest(v_keys, v_cost) AS c(key, cost) ON c.key = p.key ORDER BY p.ord);
    END IF;
    RETURN QUERY SELECT * FROM harvest_lease_rows(v_ids, ARRAY(
        SELECT p.tag - greatest(v_clock0, coalesce(lag(p.tag) OVER (ORDER BY p.ord), v_clock0))
        FROM unnest(v_tags) WITH ORDINALITY AS p(tag, ord) ORDER BY p.ord), p_worker, p_lease, v_secs);

    -- Each key's last claim of the plan sets its state; its head moves on
    -- to the row after the last one taken: read while planning, or looked
    -- up from that row when the plan used every row it read.
    SELECT array_agg(k.key), array_agg(k.tag), array_agg(k.inc), array_agg(k.id), array_agg(k.cont),
           array_agg(k.due), array_agg(k.nid), array_agg(k.ncont), array_agg(k.ndue)
    INTO v_keys, v_t, v_inc, v_hi, v_hc, v_hd, v_nids, v_nconts, v_ndues
    FROM (
        SELECT DISTINCT ON (p.key) p.key, p.tag, p.id, p.cont, p.due, c.inc, n.nid, n.ncont, n.ndue
        FROM unnest(v_pkeys, v_tags, v_ids, v_conts, v_dues) WITH ORDINALITY AS p(key, tag, id, cont, due, ord)
        JOIN unnest(v_keys, v_inc) AS c(key, inc) ON c.key = p.key
        LEFT JOIN unnest(v_nkeys, v_nids, v_nconts, v_ndues) AS n(key, nid, ncont, ndue) ON n.key = p.key
        ORDER BY p.key, p.ord DESC
    ) k;
    v_hp := array_fill(NULL::integer, ARRAY[cardinality(v_keys)]);
    FOR v_i IN 1..cardinality(v_keys) LOOP
        IF v_nids[v_i] IS NULL THEN
            SELECT * INTO r_head FROM harvest_key_head(p_queue, v_keys[v_i], v_prio, v_hc[v_i], v_hd[v_i], v_hi[v_i]);
            v_nids[v_i] := r_head.head_id;
            v_nconts[v_i] := r_head.head_cont;
            v_ndues[v_i] := r_head.head_due;
            v_hp[v_i] := r_head.head_prio;
        ELSE
            v_hp[v_i] := v_prio;
        END IF;
    END LOOP;
    UPDATE fair_state f SET
        last_start = k.tag,
        pass       = k.tag + k.inc,
        charged_at = v_now,
        in_debt    = true,
        head_id    = k.nid,
        head_prio  = k.nprio,
        head_cont  = k.ncont,
        head_due   = k.ndue
    FROM unnest(v_keys, v_t, v_inc, v_nids, v_hp, v_nconts, v_ndues) AS k(key, tag, inc, nid, nprio, ncont, ndue)
    WHERE f.queue = p_queue AND f.key = k.key;
    -- The charged keys are in debt; every key the new clock reached is not.
    IF v_clock > v_clock0 THEN
        PERFORM harvest_clock_advance(p_queue, v_clock);
    END IF;
END
$$;
