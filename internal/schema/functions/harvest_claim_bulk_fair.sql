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
--   0. when the batch's claim before it took a row of priority p_above
--      after refusals (p_ref), leaves out the keys whose heads are above
--      that priority (all refused or skipped then) and starts each row's
--      refusals with their heads;
--   1. takes the best p_n keys of the top priority from the two key
--      indexes (no debt: tag V; in debt: tag pass), merged by (tag, head).
--      No other key can take one of the next p_n claims: the first claims
--      of these p_n keys all come before its first. (Unless a refusal
--      takes a candidate out of the plan: the tag of the best key after
--      them is read too, and 3a stops the plan there once that happens.)
--   2. reads some rows of each candidate from its head (a share of p_n by
--      weight, more when that was too few) among its rows of the top
--      priority, in the key's order, and merges their tags;
--   3. keeps the plan up to the first claim that could differ from the
--      single claims: one at or after the next tag of a key read to its
--      share (it may have more rows). A key read short has no other row
--      of the top priority, so its next claim comes after all of them and
--      ends nothing; the caller's next bulk step takes the next priority;
--   3a. applies the quota rechecks to the plan in claim order, as that
--      many single claims would (see there): a refused row takes its key
--      out of the plan, and the refusals ride on the rows taken after
--      them;
--   4. leases the rows kept, and writes each key's charges and new head
--      once, the clock, and the debt marks. (The plan's rows are locked
--      before 3a, waiting as the single fair claim does, and before any
--      quota row, in the single claim's lock order: a row that left the
--      pending state or moved meanwhile ends the plan before it.)
DROP FUNCTION IF EXISTS harvest_claim_bulk_fair(text, text, timestamptz, interval, integer);
DROP FUNCTION IF EXISTS harvest_claim_bulk_fair(text, text, timestamptz, interval, integer, boolean);
CREATE OR REPLACE FUNCTION harvest_claim_bulk_fair(p_queue text, p_worker text, p_now timestamptz,
                                                   p_lease interval, p_n integer, p_runtime boolean,
                                                   p_above integer DEFAULT NULL, p_ref jsonb DEFAULT NULL)
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
    -- The rechecks of the plan's quota keys (see 3a): each quota key with a
    -- quota row, its cap, running rows, rate, tokens left, rows accepted
    -- and, once refused, why.
    v_qks     text[];
    v_xt      double precision;
    v_xc      boolean;
    v_xd      timestamptz;
    v_xi      bigint;
    v_lasthd  integer;
    v_qk      text[] := '{}';
    v_qcap    integer[] := '{}';
    v_qrun    integer[] := '{}';
    v_qrate   double precision[] := '{}';
    v_qtok    double precision[] := '{}';
    v_qtok0   double precision[] := '{}';
    v_qacc    integer[] := '{}';
    v_qwhy    text[] := '{}';
    v_qi      integer;
    v_tokens  double precision;
    v_why     text;
    v_v       double precision;
    v_keep    integer[] := '{}';
    v_refs    jsonb[] := '{}';
    v_ref     jsonb;
    v_stop    jsonb;
    v_drop    text[] := '{}';
    v_bid     bigint[] := '{}';
    v_bqk     text[] := '{}';
    v_bwhy    text[] := '{}';
    v_btag    double precision[] := '{}';
    v_bcont   boolean[] := '{}';
    v_bdue    timestamptz[] := '{}';
    v_bprio   integer[] := '{}';
    r_quota   record;
    r_out     harvest_claimed;
BEGIN
    -- 0. What the batch's claim before this step refused (p_ref), when it
    -- took a row of priority p_above: every key whose head is of a higher
    -- priority had its head refused then, or carries a quota key refused
    -- then, and a quota only gets stricter within the statement; so those
    -- keys sit out of this step, and their heads go first in every claim's
    -- refusals (3a). A head that is not where the summary says, or whose
    -- quota key that claim did not refuse, leaves the step to the single
    -- claim.
    IF p_above IS NOT NULL THEN
        FOR r_head IN
            SELECT f.pass, f.head_prio, h.id, h.state, h.priority, h.quota_key, h.continuation, h.due_at
            FROM fair_state f
            -- Each head by a probe of its own, whatever the cached plan
            -- thinks of the tables' sizes (harvest_fair_fold says why).
            LEFT JOIN LATERAL (SELECT x.id, x.state, x.priority, x.quota_key, x.continuation, x.due_at
                               FROM tasks x WHERE x.id = f.head_id OFFSET 0) h ON true
            WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.head_prio > p_above
        LOOP
            v_why := (SELECT e->>'reason' FROM jsonb_array_elements(p_ref) e
                      WHERE e->>'quota_key' = r_head.quota_key LIMIT 1);
            IF r_head.id IS NULL OR r_head.state <> 'pending' OR r_head.priority <> r_head.head_prio
               OR r_head.due_at > v_due_cut OR v_why IS NULL THEN
                RETURN;
            END IF;
            v_bid := array_append(v_bid, r_head.id);
            v_bqk := array_append(v_bqk, r_head.quota_key);
            v_bwhy := array_append(v_bwhy, v_why);
            v_btag := array_append(v_btag, coalesce(r_head.pass, '-Infinity'::double precision));
            v_bcont := array_append(v_bcont, r_head.continuation);
            v_bdue := array_append(v_bdue, r_head.due_at);
            v_bprio := array_append(v_bprio, r_head.priority);
        END LOOP;
    END IF;

    -- 1. The candidates.
    WITH u AS (
        (SELECT f.key, v_clock0 AS t, f.head_prio, f.head_cont, f.head_due, f.head_id FROM fair_state f
         WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND NOT f.in_debt
           AND (p_above IS NULL OR f.head_prio <= p_above)
         ORDER BY f.head_prio DESC, f.head_cont DESC, f.head_due, f.head_id LIMIT p_n + 1)
        UNION ALL
        (SELECT f.key, harvest_start_tag(f.pass, v_clock0), f.head_prio, f.head_cont, f.head_due, f.head_id FROM fair_state f
         WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.in_debt
           AND (p_above IS NULL OR f.head_prio <= p_above)
         ORDER BY f.head_prio DESC, f.pass, f.head_cont DESC, f.head_due, f.head_id LIMIT p_n + 1)
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
           array_agg(head_cont ORDER BY r), array_agg(head_due ORDER BY r), array_agg(head_id ORDER BY r), sum(w / cost),
           (SELECT top.t FROM top WHERE top.r = p_n + 1), (SELECT top.head_cont FROM top WHERE top.r = p_n + 1),
           (SELECT top.head_due FROM top WHERE top.r = p_n + 1), (SELECT top.head_id FROM top WHERE top.r = p_n + 1)
    INTO v_prio, v_keys, v_t, v_w, v_cost, v_inc, v_hc, v_hd, v_hi, v_sumw, v_xt, v_xc, v_xd, v_xi
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
            -- read, or whose first row read is not the head the summary
            -- names (a stale head: a row given back with a later due time,
            -- say). The candidates were ranked by the summary's heads, so
            -- a stale one may have taken the place of a key with the same
            -- tag and an earlier head; the single claim repairs the head
            -- first. A key read short has no other pending
            -- row of the top priority: its next claim, if any, comes after
            -- every claim of that priority, so it cuts nothing.
            SELECT least((SELECT min(r.tag + r.inc) FROM rows r WHERE r.o = r.got AND r.got = r.cnt),
                         (SELECT min(c.t) FROM c WHERE NOT EXISTS (SELECT 1 FROM rows r WHERE r.key = c.key)),
                         (SELECT min(c.t) FROM c JOIN rows r ON r.key = c.key AND r.o = 1
                          WHERE (r.id, r.continuation, r.due_at) IS DISTINCT FROM (c.hi, c.hc, c.hd))) AS tag
        ), ordered AS (
            SELECT r.*, row_number() OVER (ORDER BY r.tag, r.continuation DESC, r.due_at, r.id) AS seq
            FROM rows r
        ), planned AS (
            SELECT o.* FROM ordered o, cut
            WHERE o.seq <= p_n
              AND (cut.tag IS NULL OR o.tag < cut.tag)
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
               (SELECT array_agg(p.quota_key ORDER BY p.seq) FROM planned p),
               (SELECT array_agg(DISTINCT r.key) FROM rows r, cut
                WHERE r.o = r.got AND r.got = r.cnt AND r.cnt < p_n
                  AND r.tag + r.inc <= cut.tag),
               (SELECT array_agg(l.key) FROM last l), (SELECT array_agg(l.id) FROM last l),
               (SELECT array_agg(l.continuation) FROM last l), (SELECT array_agg(l.due_at) FROM last l)
        INTO v_ids, v_pkeys, v_tags, v_conts, v_dues, v_qks, v_short, v_nkeys, v_nids, v_nconts, v_ndues;
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

    -- 3. (end) Lock the plan's rows, before any quota row: a single claim
    -- locks its row and then its quota row (harvest_quota_recheck), so
    -- taking the quota rows first here could deadlock with an ordinary
    -- claim holding a row of the plan. A row that left the pending state
    -- or moved meanwhile ends the plan before it; a row the rechecks
    -- below refuse stays locked, untouched, until the commit, as the
    -- single claim's refused rows do (harvest_rows_lock).
    v_locked := harvest_rows_lock(p_queue, v_prio, v_ids, v_pkeys, v_conts, v_dues, false);
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

    -- 3a. The rechecks, as the single claims would make them one by one.
    -- Every quota row of the plan is locked (in key order) before its
    -- running rows are counted, as harvest_quota_recheck locks it. Then the
    -- plan is walked in claim order: a row of a quota key without a quota
    -- row goes on; else the row is accepted while the cap (running rows
    -- and rows accepted so far) and the bucket (its level refilled to now,
    -- less a token per row accepted so far) allow it. A refused row is its
    -- key's head: its key leaves the plan, and so does every later key
    -- whose head carries a quota key refused already (a single claim would
    -- skip it without a recheck). A quota only gets stricter within the
    -- statement (no time passes, no row of its key ends), so a refused
    -- head stays refused, and every later single claim that reaches it
    -- refuses it again: each row accepted reports the refusals its single
    -- claim would, the heads left out that come before it in that claim's
    -- order (a key's start tag never falls below the clock, so the order
    -- is taken at the clock before the claim), the first one per quota
    -- key; a claim that would reach 8 refusals ends the batch with them.
    -- Once a key left the plan, the best key outside the candidates (start
    -- tag v_xt) may come before the plan's later rows, but only after the
    -- last candidate's head: the plan stops at the first row past that
    -- head which sorts at or after that key's first claim.
    IF EXISTS (SELECT 1 FROM unnest(v_qks[1:v_k]) q WHERE q <> '') THEN
        FOR r_quota IN
            SELECT * FROM harvest_bulk_quotas(p_queue, ARRAY(SELECT DISTINCT u FROM unnest(v_qks[1:v_k]) u WHERE u <> ''),
                                              v_now)
        LOOP
            v_qk := array_append(v_qk, r_quota.quota_key);
            v_qcap := array_append(v_qcap, r_quota.max_concurrent);
            v_qrun := array_append(v_qrun, r_quota.running);
            v_qrate := array_append(v_qrate, r_quota.rate);
            v_qtok := array_append(v_qtok, r_quota.tokens);
            v_qacc := array_append(v_qacc, 0);
            v_qwhy := array_append(v_qwhy, NULL::text);
        END LOOP;
    END IF;
    IF cardinality(v_qk) > 0 OR cardinality(v_bid) > 0 THEN
        v_qtok0 := v_qtok;
        v_v := v_clock0;
        -- v_lasthd, the last turn of a candidate's head in the plan: every
        -- candidate comes before the best key outside them (start tag
        -- v_xt, head v_xc, v_xd, v_xi), so a row up to that turn is
        -- claimed before any key outside, whatever left the plan. Past it, a row still
        -- comes first when it sorts before that key's first claim: that
        -- claim's tag is at least v_xt (a tag never falls below the clock
        -- at the candidates' read), and at v_xt the heads break the tie.
        -- Read at the first refusal: a plan without one never needs it.
        FOR v_i IN 1..v_k LOOP
            CONTINUE WHEN v_pkeys[v_i] = ANY (v_drop);
            EXIT WHEN cardinality(v_drop) > 0 AND v_xt IS NOT NULL AND v_i > v_lasthd
                  AND (v_tags[v_i], NOT v_conts[v_i], v_dues[v_i], v_ids[v_i]) >= (v_xt, NOT v_xc, v_xd, v_xi);
            -- The refusals of this row's single claim so far: the heads
            -- left out that its claim order puts first.
            v_ref := '[]';
            IF cardinality(v_bid) > 0 THEN
                SELECT coalesce(jsonb_agg(jsonb_build_object('task_id', b.id, 'quota_key', b.qk, 'reason', b.why)
                                          ORDER BY b.prio DESC, b.pos, b.cont DESC, b.due, b.id), '[]')
                INTO v_ref
                FROM (SELECT DISTINCT ON (b0.qk) b0.*, greatest(b0.tag, v_v) AS pos
                      FROM unnest(v_bid, v_bqk, v_bwhy, v_btag, v_bcont, v_bdue, v_bprio)
                           AS b0(id, qk, why, tag, cont, due, prio)
                      WHERE (-b0.prio, greatest(b0.tag, v_v), NOT b0.cont, b0.due, b0.id)
                            < (-v_prio, v_tags[v_i], NOT v_conts[v_i], v_dues[v_i], v_ids[v_i])
                      ORDER BY b0.qk, b0.prio DESC, greatest(b0.tag, v_v), b0.cont DESC, b0.due, b0.id) b;
                IF jsonb_array_length(v_ref) >= 8 THEN
                    v_stop := (SELECT jsonb_agg(e ORDER BY o) FROM jsonb_array_elements(v_ref) WITH ORDINALITY AS a(e, o)
                               WHERE o <= 8);
                    EXIT;
                END IF;
            END IF;
            v_qi := array_position(v_qk, v_qks[v_i]);
            IF v_qi IS NOT NULL THEN
                v_why := v_qwhy[v_qi];
                IF v_why IS NULL THEN
                    IF v_qcap[v_qi] IS NOT NULL AND v_qrun[v_qi] + v_qacc[v_qi] >= v_qcap[v_qi] THEN
                        v_why := 'concurrency_cap';
                    ELSIF v_qrate[v_qi] IS NOT NULL AND v_qtok[v_qi] < 1 THEN
                        v_why := 'rate_limit';
                    END IF;
                    v_qwhy[v_qi] := v_why;
                END IF;
                IF v_why IS NOT NULL THEN
                    IF cardinality(v_drop) = 0 AND v_xt IS NOT NULL THEN
                        SELECT coalesce(max(f.i), 0) INTO v_lasthd
                        FROM (SELECT min(u.i) AS i FROM unnest(v_pkeys[1:v_k]) WITH ORDINALITY AS u(key, i)
                              GROUP BY u.key) f;
                        IF (SELECT count(DISTINCT u) FROM unnest(v_pkeys[1:v_k]) u) < cardinality(v_keys) THEN
                            -- A candidate's head comes after every row of the plan.
                            v_lasthd := v_k;
                        END IF;
                    END IF;
                    v_drop := array_append(v_drop, v_pkeys[v_i]);
                    v_bid := array_append(v_bid, v_ids[v_i]);
                    v_bqk := array_append(v_bqk, v_qks[v_i]);
                    v_bwhy := array_append(v_bwhy, v_why);
                    v_btag := array_append(v_btag, v_tags[v_i]);
                    v_bcont := array_append(v_bcont, v_conts[v_i]);
                    v_bdue := array_append(v_bdue, v_dues[v_i]);
                    v_bprio := array_append(v_bprio, v_prio);
                    CONTINUE;
                END IF;
                v_qacc[v_qi] := v_qacc[v_qi] + 1;
                IF v_qrate[v_qi] IS NOT NULL THEN
                    v_qtok[v_qi] := v_qtok[v_qi] - 1;
                END IF;
            END IF;
            v_keep := array_append(v_keep, v_i);
            v_refs := array_append(v_refs, v_ref);
            v_v := v_tags[v_i];
        END LOOP;
        IF cardinality(v_keep) < v_k THEN
            -- Rows left the plan: the rows read after each key's last
            -- claim no longer follow it; look the new heads up instead.
            v_nkeys := NULL;
            v_ids := ARRAY(SELECT v_ids[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_pkeys := ARRAY(SELECT v_pkeys[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_tags := ARRAY(SELECT v_tags[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_conts := ARRAY(SELECT v_conts[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_dues := ARRAY(SELECT v_dues[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_qks := ARRAY(SELECT v_qks[k.i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY k.o);
            v_k := cardinality(v_keep);
        END IF;
    END IF;
    IF v_k = 0 THEN
        IF v_stop IS NOT NULL THEN
            r_out.outcome := 'refused';
            r_out.refusals := v_stop;
            RETURN NEXT r_out;
        END IF;
        RETURN;
    END IF;

    v_ids := v_ids[1:v_k];
    v_pkeys := v_pkeys[1:v_k];
    v_tags := v_tags[1:v_k];
    v_conts := v_conts[1:v_k];
    v_dues := v_dues[1:v_k];
    v_qks := v_qks[1:v_k];
    v_clock := greatest(v_clock0, v_tags[v_k]);

    -- The rechecks' writes for the rows leased: one token per row off
    -- each bucket, taken one at a time as the single claims would.
    IF cardinality(v_qk) > 0 THEN
        FOR v_qi IN 1..cardinality(v_qk) LOOP
            CONTINUE WHEN v_qrate[v_qi] IS NULL;
            v_tokens := NULL;
            FOR v_i IN 1..v_k LOOP
                IF v_qks[v_i] = v_qk[v_qi] THEN
                    v_tokens := coalesce(v_tokens, v_qtok0[v_qi]) - 1;
                END IF;
            END LOOP;
            CONTINUE WHEN v_tokens IS NULL;
            INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at)
            VALUES (p_queue, v_qk[v_qi], v_tokens, v_now)
            ON CONFLICT (queue, quota_key) DO UPDATE
            SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at;
        END LOOP;
    END IF;

    -- Lease the rows and mark their runs running; each row reports the lag
    -- its single claim would: its tag over the clock before it.
    IF p_runtime THEN
        v_secs := ARRAY(SELECT c.cost FROM unnest(v_pkeys) WITH ORDINALITY AS p(key, ord)
                        JOIN unnest(v_keys, v_cost) AS c(key, cost) ON c.key = p.key ORDER BY p.ord);
    END IF;
    v_i := 0;
    FOR r_out IN SELECT * FROM harvest_lease_rows(v_ids, ARRAY(
        SELECT p.tag - greatest(v_clock0, coalesce(lag(p.tag) OVER (ORDER BY p.ord), v_clock0))
        FROM unnest(v_tags) WITH ORDINALITY AS p(tag, ord) ORDER BY p.ord), p_worker, p_lease, v_secs)
    LOOP
        v_i := v_i + 1;
        IF cardinality(v_refs) > 0 THEN
            r_out.refusals := v_refs[v_i];
        END IF;
        RETURN NEXT r_out;
    END LOOP;

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
    -- The claim after the last row taken would have reached 8 refusals.
    IF v_stop IS NOT NULL THEN
        r_out := NULL;
        r_out.outcome := 'refused';
        r_out.refusals := v_stop;
        RETURN NEXT r_out;
    END IF;
END
$$;
