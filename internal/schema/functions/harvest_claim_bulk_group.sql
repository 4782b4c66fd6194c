-- One bulk step of a batch in a two-level fair queue: up to p_n rows in the
-- order as many single claims would take them (harvest_pick_group_heads,
-- then harvest_charge), with the lags they would report and the charges
-- they would make to the keys and to their groups; or fewer, down to none,
-- where this step cannot be sure of that order, and the caller goes on
-- with the single claim. The caller holds the queue's fair lock, has
-- folded its arrivals, and checked that there is no ageing, no row pinned
-- to the worker, and that the claim before this step refused nothing (a
-- refused head would be refused again by every later claim, and this step
-- carries no refusals). p_runtime: the queue is charged by runtime (each
-- claim bills its key's held estimate, fixed within the statement).
--
-- The single claims compare the keys whose heads share the top priority
-- by their group's lag among the groups, then their own lag within their
-- group, then their heads. One level's merge of start tags
-- (harvest_claim_bulk_fair) does not give that order: two groups that tie
-- are told apart by key lags taken against two different key clocks. So
-- the step replays the single claims one by one on figures read once,
-- with the same arithmetic (harvest_lag, harvest_start_tag, the running
-- sums of harvest_charge), and writes the result once:
--   1. reads every key with a head of the top priority (as the single pick
--      does), ranks the groups by their best key in the pick's order, and
--      keeps the first p_n groups and, in each, its first keys (a share of
--      p_n by group weight). What is left out is kept as bounds: the groups
--      left out by their start tags (max(pass, clock): their order holds
--      as the groups' clock moves, and a lag is 0 exactly when the tag is
--      at most the clock) with the best (key lag, head) among them, and
--      per kept group its keys left out by their start tags with the best
--      head among them. At any point of the replay, nothing left out comes
--      before (the least lag left out; among those of lag 0 the best of
--      them, else the best of all);
--   2. reads some rows of each key kept from its head (the head's band from
--      the head on, then the normal band when the head is a continuation),
--      and more of a key when the replay has used all read so far;
--   3. replays the claims: each takes the least (group lag, key lag, band,
--      due time, id) among the kept keys' heads, and the plan stops before
--      a claim that something left out could take or tie (it is not
--      strictly before the bound), or whose key's head is not where the
--      summary says (the single claim repairs it first). A charge moves the
--      key's pass, its group's key clock and pass, the groups' clock and
--      the queue clock V as harvest_charge does;
--   4. locks the rows replayed (a row that left the pending state or moved
--      ends the plan before it), makes the quota rechecks in claim order
--      with the numbers the single claims would see (as
--      harvest_claim_bulk_fair does), and ends the plan before the first
--      row refused (the single claim refuses it and reports the refusal);
--   5. leases the rows kept and writes each key's state and new head, each
--      group's row, the groups' clock, V and the debt marks once.
CREATE OR REPLACE FUNCTION harvest_claim_bulk_group(p_queue text, p_worker text, p_now timestamptz,
                                                    p_lease interval, p_n integer, p_runtime boolean)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
-- See harvest_claim_bulk_fair.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_clock0  double precision := harvest_clock(p_queue);
    v_clock   double precision;
    v_gclock0 double precision;
    v_gclock  double precision;
    v_prio    integer;
    -- The groups left out, by start tag: the tag, and the rank of the best
    -- (key lag, head) among those up to it; by that rank, the key lag and
    -- head. v_xgpos: how many of them are of lag 0 now.
    xg_s      double precision[];
    xg_pm     integer[];
    xg_kl     double precision[];
    xg_c      boolean[];
    xg_d      timestamptz[];
    xg_i      bigint[];
    v_xgpos   integer := 0;
    -- The keys left out of the kept groups, by group and start tag: the
    -- tag and the rank of the best head among those up to it; by that
    -- rank, the head.
    xk_grp    integer[];
    xk_s      double precision[];
    xk_pm     integer[];
    xk_c      boolean[];
    xk_d      timestamptz[];
    xk_i      bigint[];
    -- The groups kept, by rank: name, pass, weight, key clock, the range
    -- of their keys left out and how many of those are of lag 0 now, the
    -- range of their keys kept, and what the group competes with now: the
    -- best kept key (0: the bound of the keys left out, which may come
    -- first), its key lag and head (head id NULL: no work of the top
    -- priority left).
    g_name    text[];
    g_pass    double precision[];
    g_w       double precision[];
    g_kc      double precision[];
    g_x0      integer[];
    g_x1      integer[];
    g_xpos    integer[];
    g_k0      integer[];
    g_k1      integer[];
    g_best    integer[];
    g_bkl     double precision[];
    g_bc      boolean[];
    g_bd      timestamptz[];
    g_bi      bigint[];
    -- The keys kept, by group and rank: name, group, pass, cost and step of
    -- a claim, rows to read and read, the head (band, due time, id; the
    -- summary's, then the rows read; id NULL once none of the top priority
    -- is left), its row read (0: none), the last row read, whether more
    -- rows may follow it, and whether the first row read is not the
    -- summary's head.
    k_name    text[];
    k_grp     integer[];
    k_pass    double precision[];
    k_cost    double precision[];
    k_step    double precision[];
    k_w       double precision[];
    k_est     double precision[];
    k_cnt     integer[];
    k_got     integer[];
    k_hc      boolean[];
    k_hd      timestamptz[];
    k_hi      bigint[];
    k_cur     integer[];
    k_last    integer[];
    k_more    boolean[];
    k_stale   boolean[];
    -- The rows read, each with its key and the next row read of its key
    -- (0: none).
    r_key     integer[] := '{}';
    r_id      bigint[] := '{}';
    r_cont    boolean[] := '{}';
    r_due     timestamptz[] := '{}';
    r_qk      text[] := '{}';
    r_next    integer[] := '{}';
    -- The claims replayed: key, row, lag, the key's start and pass, what
    -- the claim billed, the group's start and pass, its key clock, the groups' clock and V after
    -- it.
    s_k       integer[] := '{}';
    s_r       integer[] := '{}';
    s_lag     double precision[] := '{}';
    s_kst     double precision[] := '{}';
    s_kps     double precision[] := '{}';
    s_cost    double precision[] := '{}';
    s_gst     double precision[] := '{}';
    s_gps     double precision[] := '{}';
    s_kc      double precision[] := '{}';
    s_gclock  double precision[] := '{}';
    s_clock   double precision[] := '{}';
    v_g       integer;
    v_nk      integer;
    v_i       integer;
    v_j       integer;
    v_ki      integer;
    v_gi      integer;
    v_ri      integer;
    v_lo      integer;
    v_hi      integer;
    v_k       integer := 0;
    v_bgl     double precision;
    v_gl      double precision;
    v_kl      double precision;
    v_xl      double precision;
    v_xr      integer;
    v_kst     double precision;
    v_gst     double precision;
    v_ids     bigint[];
    v_cont    boolean[];
    v_due     timestamptz[];
    v_qks     text[];
    v_locked  bigint[];
    v_cut     boolean := false;
    v_pkeys   text[];
    -- The rechecks (see harvest_claim_bulk_fair, 3a).
    v_qk      text[] := '{}';
    v_qcap    integer[] := '{}';
    v_qrun    integer[] := '{}';
    v_qrate   double precision[] := '{}';
    v_qtok    double precision[] := '{}';
    v_qtok0   double precision[] := '{}';
    v_qacc    integer[] := '{}';
    v_qi      integer;
    v_tokens  double precision;
    v_secs    double precision[];
    r_quota   record;
    r_head    record;
BEGIN
    SELECT coalesce(max(q.group_clock), 0) INTO v_gclock0 FROM fair_queues q WHERE q.queue = p_queue;

    -- 1. The groups and keys kept, and the bounds of those left out.
    -- The parts are scans of the ones before, without joins between them
    -- (their estimates are poor): a key's group row and weight are read
    -- by one probe each, as the single pick reads the row.
    WITH k AS (
        SELECT f.key, f.pass, f.head_prio, f.head_cont, f.head_due, f.head_id, s.grp, g.pass AS gpass,
               coalesce(g.key_clock, 0) AS kc, coalesce(w.weight, 1::double precision) AS gw
        FROM fair_state f
        CROSS JOIN LATERAL (SELECT split_part(f.key, '/', 1) AS grp) s
        LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                           WHERE g0.queue = p_queue AND g0.grp = s.grp LIMIT 1) g ON true
        LEFT JOIN LATERAL (SELECT w0.weight FROM group_weights w0
                           WHERE w0.queue = p_queue AND w0.grp = s.grp LIMIT 1) w ON true
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL
    ), top AS (
        SELECT k.*, harvest_lag(k.gpass, v_gclock0) AS glag, harvest_lag(k.pass, k.kc) AS klag,
               harvest_start_tag(k.pass, k.kc) AS s0, harvest_start_tag(k.gpass, v_gclock0) AS gs0
        FROM k WHERE k.head_prio = (SELECT max(k2.head_prio) FROM k k2)
    ), inner_rank AS (
        -- kr: the key's rank in its group; b*: the group's best key.
        SELECT t.*, row_number() OVER w AS kr, first_value(t.klag) OVER w AS bklag,
               first_value(t.head_cont) OVER w AS bcont, first_value(t.head_due) OVER w AS bdue,
               first_value(t.head_id) OVER w AS bid
        FROM top t
        WINDOW w AS (PARTITION BY t.grp ORDER BY t.klag, t.head_cont DESC, t.head_due, t.head_id)
    ), ranked AS (
        -- gr: the group's rank by its best key in the pick's order.
        SELECT r.*, dense_rank() OVER (ORDER BY r.glag, r.bklag, r.bcont DESC, r.bdue, r.bid) AS gr
        FROM inner_rank r
    ), capped AS (
        -- The keys of the groups kept, with their group's share of p_n
        -- keys by weight.
        SELECT r.*, least(p_n, ceil(p_n * r.gw / sum(r.gw) FILTER (WHERE r.kr = 1) OVER ())::integer + 1) AS cap
        FROM ranked r WHERE r.gr <= p_n
    ), cg AS (
        SELECT c.* FROM capped c WHERE c.kr = 1
    ), xg AS (
        SELECT r.gs0, row_number() OVER (ORDER BY r.klag, r.head_cont DESC, r.head_due, r.head_id) AS xr,
               r.klag, r.head_cont, r.head_due, r.head_id
        FROM ranked r WHERE r.kr = 1 AND r.gr > p_n
    ), xgp AS (
        SELECT xg.*, min(xg.xr) OVER (ORDER BY xg.gs0, xg.xr ROWS UNBOUNDED PRECEDING) AS pm FROM xg
    ), ck AS (
        SELECT c.key, c.pass, c.head_cont, c.head_due, c.head_id, c.kr, c.gr, t.weight, t.cost, t.step,
               (SELECT f.held_est FROM fair_state f
                WHERE p_runtime AND f.queue = p_queue AND f.key = c.key AND f.charged_at IS NULL) AS held_est
        FROM capped c
        CROSS JOIN LATERAL harvest_charge_terms(p_queue, c.key, p_runtime) t
        WHERE c.kr <= c.cap
    ), xk AS (
        SELECT c.gr, c.s0, c.head_cont, c.head_due, c.head_id,
               row_number() OVER (ORDER BY c.head_cont DESC, c.head_due, c.head_id) AS xr
        FROM capped c WHERE c.kr > c.cap
    ), xkp AS (
        SELECT xk.*, min(xk.xr) OVER (PARTITION BY xk.gr ORDER BY xk.s0, xk.xr ROWS UNBOUNDED PRECEDING) AS pm
        FROM xk
    )
    SELECT (SELECT max(head_prio) FROM top),
           (SELECT array_agg(x.gs0 ORDER BY x.gs0, x.xr) FROM xgp x), (SELECT array_agg(x.pm ORDER BY x.gs0, x.xr) FROM xgp x),
           (SELECT array_agg(x.klag ORDER BY x.xr) FROM xg x), (SELECT array_agg(x.head_cont ORDER BY x.xr) FROM xg x),
           (SELECT array_agg(x.head_due ORDER BY x.xr) FROM xg x), (SELECT array_agg(x.head_id ORDER BY x.xr) FROM xg x),
           (SELECT array_agg(x.gr ORDER BY x.gr, x.s0, x.xr) FROM xkp x),
           (SELECT array_agg(x.s0 ORDER BY x.gr, x.s0, x.xr) FROM xkp x),
           (SELECT array_agg(x.pm ORDER BY x.gr, x.s0, x.xr) FROM xkp x),
           (SELECT array_agg(x.head_cont ORDER BY x.xr) FROM xk x), (SELECT array_agg(x.head_due ORDER BY x.xr) FROM xk x),
           (SELECT array_agg(x.head_id ORDER BY x.xr) FROM xk x),
           (SELECT array_agg(x.grp ORDER BY x.gr) FROM cg x), (SELECT array_agg(x.gpass ORDER BY x.gr) FROM cg x),
           (SELECT array_agg(x.gw ORDER BY x.gr) FROM cg x), (SELECT array_agg(x.kc ORDER BY x.gr) FROM cg x),
           (SELECT array_agg(x.key ORDER BY x.gr, x.kr) FROM ck x), (SELECT array_agg(x.gr ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.pass ORDER BY x.gr, x.kr) FROM ck x), (SELECT array_agg(x.cost ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.step ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.weight ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.held_est ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.head_cont ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.head_due ORDER BY x.gr, x.kr) FROM ck x),
           (SELECT array_agg(x.head_id ORDER BY x.gr, x.kr) FROM ck x)
    INTO v_prio, xg_s, xg_pm, xg_kl, xg_c, xg_d, xg_i, xk_grp, xk_s, xk_pm, xk_c, xk_d, xk_i,
         g_name, g_pass, g_w, g_kc, k_name, k_grp, k_pass, k_cost, k_step, k_w, k_est, k_hc, k_hd, k_hi;
    IF g_name IS NULL THEN
        RETURN;
    END IF;
    v_g := cardinality(g_name);
    v_nk := cardinality(k_name);
    g_k0 := array_fill(0, ARRAY[v_g]);
    g_k1 := array_fill(-1, ARRAY[v_g]);
    g_x0 := array_fill(0, ARRAY[v_g]);
    g_x1 := array_fill(-1, ARRAY[v_g]);
    g_xpos := array_fill(0, ARRAY[v_g]);
    g_best := array_fill(0, ARRAY[v_g]);
    g_bkl := array_fill(NULL::double precision, ARRAY[v_g]);
    g_bc := array_fill(NULL::boolean, ARRAY[v_g]);
    g_bd := array_fill(NULL::timestamptz, ARRAY[v_g]);
    g_bi := array_fill(NULL::bigint, ARRAY[v_g]);
    FOR v_i IN 1..v_nk LOOP
        IF g_k0[k_grp[v_i]] = 0 THEN
            g_k0[k_grp[v_i]] := v_i;
        END IF;
        g_k1[k_grp[v_i]] := v_i;
    END LOOP;
    FOR v_i IN 1..coalesce(cardinality(xk_grp), 0) LOOP
        IF g_x0[xk_grp[v_i]] = 0 THEN
            g_x0[xk_grp[v_i]] := v_i;
        END IF;
        g_x1[xk_grp[v_i]] := v_i;
    END LOOP;

    -- 2. The first rows of each key kept.
    k_cnt := array_fill(least(p_n, ceil(p_n::double precision / v_nk)::integer + 1), ARRAY[v_nk]);
    k_got := array_fill(0, ARRAY[v_nk]);
    k_cur := array_fill(0, ARRAY[v_nk]);
    k_last := array_fill(0, ARRAY[v_nk]);
    k_more := array_fill(false, ARRAY[v_nk]);
    k_stale := array_fill(false, ARRAY[v_nk]);
    SELECT coalesce(array_agg(x.ki ORDER BY x.ki, x.o), '{}'), coalesce(array_agg(x.id ORDER BY x.ki, x.o), '{}'),
           coalesce(array_agg(x.continuation ORDER BY x.ki, x.o), '{}'),
           coalesce(array_agg(x.due_at ORDER BY x.ki, x.o), '{}'),
           coalesce(array_agg(x.quota_key ORDER BY x.ki, x.o), '{}')
    INTO r_key, r_id, r_cont, r_due, r_qk
    FROM (
        SELECT c.ki, z.id, z.continuation, z.due_at, z.quota_key,
               row_number() OVER (PARTITION BY c.ki ORDER BY z.continuation DESC, z.due_at, z.id) AS o
        FROM unnest(k_name, k_hc, k_hd, k_hi, k_cnt) WITH ORDINALITY AS c(key, hc, hd, hi, cnt, ki)
        CROSS JOIN LATERAL (
            (SELECT y.id, y.continuation, y.due_at, y.quota_key FROM tasks y
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
            LIMIT c.cnt) z
    ) x;
    r_next := array_fill(0, ARRAY[greatest(cardinality(r_id), 1)]);
    FOR v_ri IN 1..cardinality(r_id) LOOP
        v_ki := r_key[v_ri];
        IF k_last[v_ki] = 0 THEN
            k_cur[v_ki] := v_ri;
        ELSE
            r_next[k_last[v_ki]] := v_ri;
        END IF;
        k_last[v_ki] := v_ri;
        k_got[v_ki] := k_got[v_ki] + 1;
    END LOOP;
    FOR v_ki IN 1..v_nk LOOP
        v_ri := k_cur[v_ki];
        -- A key without its summary's head among the rows read: the single
        -- claim repairs the head before taking anything of it.
        k_stale[v_ki] := v_ri = 0 OR (r_id[v_ri], r_cont[v_ri], r_due[v_ri])
                                     IS DISTINCT FROM (k_hi[v_ki], k_hc[v_ki], k_hd[v_ki]);
        k_more[v_ki] := k_got[v_ki] >= k_cnt[v_ki];
    END LOOP;

    -- 3. The replay. Each group first competes with its best kept key, or
    -- with the bound of its keys left out when that bound is not after it.
    v_gclock := v_gclock0;
    v_clock := v_clock0;
    v_gi := 0;
    LOOP
        -- What the groups v_gi (all at first, then the one just charged)
        -- compete with now.
        v_lo := CASE WHEN v_gi = 0 THEN 1 ELSE v_gi END;
        v_hi := CASE WHEN v_gi = 0 THEN v_g ELSE v_gi END;
        FOR v_i IN v_lo..v_hi LOOP
            g_best[v_i] := 0;
            g_bi[v_i] := NULL;
            FOR v_ki IN g_k0[v_i]..g_k1[v_i] LOOP
                CONTINUE WHEN k_hi[v_ki] IS NULL;
                v_kl := harvest_lag(k_pass[v_ki], g_kc[v_i]);
                IF g_bi[v_i] IS NULL OR (v_kl, NOT k_hc[v_ki], k_hd[v_ki], k_hi[v_ki])
                        < (g_bkl[v_i], NOT g_bc[v_i], g_bd[v_i], g_bi[v_i]) THEN
                    g_best[v_i] := v_ki;
                    g_bkl[v_i] := v_kl;
                    g_bc[v_i] := k_hc[v_ki];
                    g_bd[v_i] := k_hd[v_ki];
                    g_bi[v_i] := k_hi[v_ki];
                END IF;
            END LOOP;
            IF g_x0[v_i] > 0 THEN
                WHILE g_x0[v_i] + g_xpos[v_i] <= g_x1[v_i] AND xk_s[g_x0[v_i] + g_xpos[v_i]] <= g_kc[v_i] LOOP
                    g_xpos[v_i] := g_xpos[v_i] + 1;
                END LOOP;
                IF g_xpos[v_i] > 0 THEN
                    v_xl := 0;
                    v_xr := xk_pm[g_x0[v_i] + g_xpos[v_i] - 1];
                ELSE
                    v_xl := xk_s[g_x0[v_i]] - g_kc[v_i];
                    v_xr := xk_pm[g_x1[v_i]];
                END IF;
                IF g_bi[v_i] IS NULL OR NOT ((g_bkl[v_i], NOT g_bc[v_i], g_bd[v_i], g_bi[v_i])
                                             < (v_xl, NOT xk_c[v_xr], xk_d[v_xr], xk_i[v_xr])) THEN
                    g_best[v_i] := 0;
                    g_bkl[v_i] := v_xl;
                    g_bc[v_i] := xk_c[v_xr];
                    g_bd[v_i] := xk_d[v_xr];
                    g_bi[v_i] := xk_i[v_xr];
                END IF;
            END IF;
        END LOOP;
        EXIT WHEN v_k >= p_n;
        -- The pick among the groups kept.
        v_gi := 0;
        FOR v_i IN 1..v_g LOOP
            CONTINUE WHEN g_bi[v_i] IS NULL;
            v_gl := harvest_lag(g_pass[v_i], v_gclock);
            -- The group lags differ far more often than they tie.
            IF v_gi = 0 OR v_gl < v_bgl
               OR (v_gl = v_bgl AND (g_bkl[v_i], NOT g_bc[v_i], g_bd[v_i], g_bi[v_i])
                                    < (g_bkl[v_gi], NOT g_bc[v_gi], g_bd[v_gi], g_bi[v_gi])) THEN
                v_gi := v_i;
                v_bgl := v_gl;
            END IF;
        END LOOP;
        -- No kept group has work of the top priority left: the caller's
        -- next step goes on (with the groups left out, or the next
        -- priority).
        EXIT WHEN v_gi = 0;
        v_ki := g_best[v_gi];
        -- A key left out may come first in the group, or the key's head is
        -- stale.
        EXIT WHEN v_ki = 0 OR k_stale[v_ki];
        -- A group left out may come first.
        IF xg_s IS NOT NULL THEN
            WHILE v_xgpos < cardinality(xg_s) AND xg_s[v_xgpos + 1] <= v_gclock LOOP
                v_xgpos := v_xgpos + 1;
            END LOOP;
            IF v_xgpos > 0 THEN
                v_xl := 0;
                v_xr := xg_pm[v_xgpos];
            ELSE
                v_xl := xg_s[1] - v_gclock;
                v_xr := xg_pm[cardinality(xg_s)];
            END IF;
            EXIT WHEN NOT ((v_bgl, g_bkl[v_gi], NOT g_bc[v_gi], g_bd[v_gi], g_bi[v_gi])
                           < (v_xl, xg_kl[v_xr], NOT xg_c[v_xr], xg_d[v_xr], xg_i[v_xr]));
        END IF;
        v_ri := k_cur[v_ki];
        -- The charge (harvest_charge, two levels).
        v_kst := harvest_start_tag(k_pass[v_ki], g_kc[v_gi]);
        v_gst := harvest_start_tag(g_pass[v_gi], v_gclock);
        k_pass[v_ki] := v_kst + k_step[v_ki];
        g_pass[v_gi] := v_gst + k_cost[v_ki] / g_w[v_gi];
        g_kc[v_gi] := greatest(g_kc[v_gi], v_kst);
        v_gclock := greatest(v_gclock, v_gst);
        v_clock := greatest(v_clock, v_kst);
        v_k := v_k + 1;
        s_k[v_k] := v_ki;
        s_r[v_k] := v_ri;
        s_lag[v_k] := g_bkl[v_gi];
        s_kst[v_k] := v_kst;
        s_kps[v_k] := k_pass[v_ki];
        s_cost[v_k] := k_cost[v_ki];
        s_gst[v_k] := v_gst;
        s_gps[v_k] := g_pass[v_gi];
        s_kc[v_k] := g_kc[v_gi];
        s_gclock[v_k] := v_gclock;
        s_clock[v_k] := v_clock;
        -- A key charged for the first time bills its estimate from its next
        -- claim on (harvest_charge_terms reads it only once the key has
        -- been charged).
        IF k_est[v_ki] IS NOT NULL THEN
            k_cost[v_ki] := k_est[v_ki];
            k_step[v_ki] := k_est[v_ki] / k_w[v_ki];
            k_est[v_ki] := NULL;
        END IF;
        -- The key's next row: read already, or read now when its last
        -- read filled its count (it may have more of the top priority).
        IF r_next[v_ri] = 0 AND k_more[v_ki] AND v_k < p_n THEN
            v_j := cardinality(r_id);
            k_cnt[v_ki] := least(p_n - v_k, greatest(2 * k_cnt[v_ki], 4));
            SELECT r_id || coalesce(array_agg(z.id ORDER BY z.o), '{}'),
                   r_cont || coalesce(array_agg(z.continuation ORDER BY z.o), '{}'),
                   r_due || coalesce(array_agg(z.due_at ORDER BY z.o), '{}'),
                   r_qk || coalesce(array_agg(z.quota_key ORDER BY z.o), '{}'),
                   count(*)
            INTO r_id, r_cont, r_due, r_qk, v_i
            FROM (
                SELECT z0.*, row_number() OVER (ORDER BY z0.continuation DESC, z0.due_at, z0.id) AS o
                FROM ((SELECT y.id, y.continuation, y.due_at, y.quota_key FROM tasks y
                       WHERE y.queue = p_queue AND y.fairness_key = k_name[v_ki] AND y.state = 'pending'
                         AND y.priority = v_prio AND y.continuation = r_cont[v_ri]
                         AND (y.due_at, y.id) > (r_due[v_ri], r_id[v_ri])
                         AND y.due_at <= v_due_cut
                       ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                       LIMIT k_cnt[v_ki])
                      UNION ALL
                      (SELECT y.id, y.continuation, y.due_at, y.quota_key FROM tasks y
                       WHERE r_cont[v_ri] AND y.queue = p_queue AND y.fairness_key = k_name[v_ki]
                         AND y.state = 'pending' AND y.priority = v_prio AND NOT y.continuation
                         AND y.due_at <= v_due_cut
                       ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                       LIMIT k_cnt[v_ki])
                      ORDER BY 2 DESC, 3, 1
                      LIMIT k_cnt[v_ki]) z0
            ) z;
            k_more[v_ki] := v_i >= k_cnt[v_ki];
            FOR v_i IN v_j + 1..cardinality(r_id) LOOP
                r_key[v_i] := v_ki;
                r_next[v_i] := 0;
                r_next[k_last[v_ki]] := v_i;
                k_last[v_ki] := v_i;
            END LOOP;
        END IF;
        v_j := r_next[v_ri];
        k_cur[v_ki] := v_j;
        IF v_j = 0 THEN
            -- No row of the top priority left (or none read, once the plan
            -- is full): the key leaves the replay.
            k_hi[v_ki] := NULL;
        ELSE
            k_hi[v_ki] := r_id[v_j];
            k_hc[v_ki] := r_cont[v_j];
            k_hd[v_ki] := r_due[v_j];
        END IF;
    END LOOP;
    IF v_k = 0 THEN
        RETURN;
    END IF;

    -- 4. Lock the rows replayed, before any quota row (the single claim's
    -- order); a row that left the pending state or moved ends the plan
    -- before it. The rows are found by id alone and compared once locked
    -- (see harvest_claim_bulk_fair, 3. end).
    v_ids := ARRAY(SELECT r_id[s.r] FROM unnest(s_k, s_r) WITH ORDINALITY AS s(k, r, o) ORDER BY s.o);
    v_pkeys := ARRAY(SELECT k_name[s.k] FROM unnest(s_k) WITH ORDINALITY AS s(k, o) ORDER BY s.o);
    v_cont := ARRAY(SELECT r_cont[s.r] FROM unnest(s_r) WITH ORDINALITY AS s(r, o) ORDER BY s.o);
    v_due := ARRAY(SELECT r_due[s.r] FROM unnest(s_r) WITH ORDINALITY AS s(r, o) ORDER BY s.o);
    v_qks := ARRAY(SELECT r_qk[s.r] FROM unnest(s_r) WITH ORDINALITY AS s(r, o) ORDER BY s.o);
    SELECT array_agg(x.id) INTO v_locked FROM (
        SELECT t.id, t.state, t.queue, t.fairness_key, t.priority, t.continuation, t.due_at FROM tasks t
        WHERE t.id = ANY (v_ids)
        ORDER BY t.id OFFSET 0 FOR UPDATE OF t) x
    JOIN unnest(v_ids, v_pkeys, v_cont, v_due) AS p(id, key, cont, due) ON p.id = x.id
    WHERE x.state = 'pending' AND x.queue = p_queue AND x.fairness_key = p.key AND x.priority = v_prio
      AND x.continuation = p.cont AND x.due_at = p.due;
    FOR v_i IN 1..v_k LOOP
        IF v_locked IS NULL OR NOT (v_ids[v_i] = ANY (v_locked)) THEN
            v_k := v_i - 1;
            v_cut := true;
            EXIT;
        END IF;
    END LOOP;
    IF v_k = 0 THEN
        RETURN;
    END IF;

    -- The rechecks of the plan's quota keys, as harvest_claim_bulk_fair's
    -- (3a): the quota rows locked in key order, their running rows counted
    -- and buckets refilled once; the plan ends before the first row its
    -- single claim would refuse.
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
        END LOOP;
        v_qtok0 := v_qtok;
        FOR v_i IN 1..v_k LOOP
            v_qi := array_position(v_qk, v_qks[v_i]);
            CONTINUE WHEN v_qi IS NULL;
            IF (v_qcap[v_qi] IS NOT NULL AND v_qrun[v_qi] + v_qacc[v_qi] >= v_qcap[v_qi])
               OR (v_qrate[v_qi] IS NOT NULL AND v_qtok[v_qi] < 1) THEN
                v_k := v_i - 1;
                EXIT;
            END IF;
            v_qacc[v_qi] := v_qacc[v_qi] + 1;
            IF v_qrate[v_qi] IS NOT NULL THEN
                v_qtok[v_qi] := v_qtok[v_qi] - 1;
            END IF;
        END LOOP;
        IF v_k = 0 THEN
            RETURN;
        END IF;
        -- One token per row leased off each bucket, taken one at a time as
        -- the single claims would.
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

    -- 5. Lease the rows, each with the lag its single claim would report.
    IF p_runtime THEN
        v_secs := s_cost[1:v_k];
    END IF;
    RETURN QUERY SELECT * FROM harvest_lease_rows(v_ids[1:v_k], s_lag[1:v_k], p_worker, p_lease, v_secs);

    -- Each key's last claim of the plan sets its state; its head moves on
    -- to the row read after the one taken, or, when none was read or the
    -- plan was cut at a row that moved, to the row the key's index gives.
    v_clock := s_clock[v_k];
    v_gclock := s_gclock[v_k];
    FOR r_head IN
        SELECT DISTINCT ON (s.k) s.k, s.r, s.kst, s.kps
        FROM unnest(s_k[1:v_k], s_r[1:v_k], s_kst[1:v_k], s_kps[1:v_k]) WITH ORDINALITY AS s(k, r, kst, kps, o)
        ORDER BY s.k, s.o DESC
    LOOP
        v_ri := r_head.r;
        v_j := CASE WHEN v_cut THEN 0 ELSE r_next[v_ri] END;
        IF v_j > 0 THEN
            UPDATE fair_state SET
                last_start = r_head.kst, pass = r_head.kps, charged_at = v_now, in_debt = r_head.kps > v_clock,
                head_id = r_id[v_j], head_prio = v_prio, head_cont = r_cont[v_j], head_due = r_due[v_j]
            WHERE queue = p_queue AND key = k_name[r_head.k];
        ELSE
            UPDATE fair_state f SET
                last_start = r_head.kst, pass = r_head.kps, charged_at = v_now, in_debt = r_head.kps > v_clock,
                head_id = h.head_id, head_prio = h.head_prio, head_cont = h.head_cont, head_due = h.head_due
            FROM harvest_key_head(p_queue, k_name[r_head.k], v_prio, r_cont[v_ri], r_due[v_ri], r_id[v_ri]) h
            WHERE f.queue = p_queue AND f.key = k_name[r_head.k];
        END IF;
    END LOOP;
    -- Each group's last claim sets its row (created as the single charge
    -- creates it); the key clock is the largest start of its keys.
    INSERT INTO fair_groups AS g (queue, grp, pass, last_start, charged_at, key_clock)
    SELECT DISTINCT ON (k_grp[s.k]) p_queue, g_name[k_grp[s.k]], s.gps, s.gst, v_now, s.kc
    FROM unnest(s_k[1:v_k], s_gst[1:v_k], s_gps[1:v_k], s_kc[1:v_k]) WITH ORDINALITY AS s(k, gst, gps, kc, o)
    ORDER BY k_grp[s.k], s.o DESC
    ON CONFLICT (queue, grp) DO UPDATE SET
        pass = excluded.pass, last_start = excluded.last_start, charged_at = excluded.charged_at,
        key_clock = greatest(g.key_clock, excluded.key_clock);
    IF v_gclock > v_gclock0 THEN
        INSERT INTO fair_queues AS q (queue, clock, group_clock) VALUES (p_queue, 0, v_gclock)
        ON CONFLICT (queue) DO UPDATE SET group_clock = greatest(q.group_clock, excluded.group_clock);
    END IF;
    -- The charged keys' debt marks are set above against the last clock;
    -- every other key the clock reached loses its mark.
    IF v_clock > v_clock0 THEN
        PERFORM harvest_clock_advance(p_queue, v_clock);
    END IF;
END
$$;
