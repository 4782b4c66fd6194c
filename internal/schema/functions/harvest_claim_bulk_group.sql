-- One bulk step of a batch in a two-level fair queue: up to p_n rows in the
-- order as many single claims would take them (harvest_pick_group_heads,
-- harvest_pick_group_rows after a refusal, then harvest_charge), with the
-- lags and refusals they would report and the charges they would make to
-- the keys and to their groups; or fewer, down to none, where this step
-- cannot be sure of that order, and the caller goes on with the single
-- claim. The caller holds the queue's fair lock, has folded its arrivals,
-- and checked that there is no ageing and no row pinned to the worker.
-- p_runtime: the queue is charged by runtime (each claim bills its key's
-- held estimate, fixed within the statement). p_above, p_ref: the priority
-- of the row the batch's claim before this step took and that claim's
-- refusals, when it had any (as for harvest_claim_bulk_fair).
--
-- The single claims compare the keys whose heads share the top priority
-- by their group's lag among the groups, then their own lag within their
-- group, then their heads. One level's merge of start tags
-- (harvest_claim_bulk_fair) does not give that order: two groups that tie
-- are told apart by key lags taken against two different key clocks. So
-- the step replays the single claims one by one on figures read once,
-- with the same arithmetic (harvest_lag, harvest_start_tag, the running
-- sums of harvest_charge), and writes the result once:
--   0. when the claim before it refused heads and took a row of priority
--      p_above, the keys whose heads are above that priority sit out (their
--      heads were refused or skipped then, and a quota only gets stricter
--      within the statement) and are reported first by every claim, in the
--      claim's order; a head not where the summary says, or whose quota key
--      that claim did not refuse, leaves the step to the single claim;
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
--   3. replays the claims: each reaches the least (group lag, key lag, band,
--      due time, id) among the kept keys' heads that do not sit out, and
--      the plan stops before a pick that something left out could take or
--      tie (it is not strictly before the bound), or whose key's head is not
--      where the summary says (the single claim repairs it first). A charge
--      moves the key's pass, its group's key clock and pass, the groups'
--      clock and the queue clock V as harvest_charge does. A head the
--      rechecks refuse is not charged: its key sits out of the rest of the
--      replay (its head stays its head, and stays refused), and the claim
--      reaches the next head, as the single claim does;
--   4. the rechecks need the quota rows, which are locked only after the
--      rows (the single claim's lock order). So the replay runs first as a
--      plan, in which only the heads of quota keys known to be refused (by
--      p_ref, or by an earlier check) sit out; the rows it reaches are
--      locked (a row that left the pending state or moved cannot be taken),
--      the quota rows of their quota keys locked and read, and the replay
--      runs again as the check: the rechecks in claim order with the
--      numbers the single claims would see (as harvest_claim_bulk_fair,
--      3a), each row taken reporting the refused heads its single claim
--      would reach before it (those that sort before it in that claim's
--      order, the first of each quota key), a claim that would reach 8
--      refusals ending the batch with them. The check stops before a row
--      the plan did not lock or a quota key it did not read: when it found
--      a refusal the plan did not know, the plan runs again with it (the
--      new rows locked without waiting, since quota rows are held now), at
--      most three plans in all;
--   5. leases the rows kept and writes each key's state and new head, each
--      group's row, the groups' clock, V and the debt marks once.
DROP FUNCTION IF EXISTS harvest_claim_bulk_group(text, text, timestamptz, interval, integer, boolean);
CREATE OR REPLACE FUNCTION harvest_claim_bulk_group(p_queue text, p_worker text, p_now timestamptz,
                                                    p_lease interval, p_n integer, p_runtime boolean,
                                                    p_above integer DEFAULT NULL, p_ref jsonb DEFAULT NULL)
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
    -- The state the replay starts from, for each of its runs.
    k_pass0   double precision[];
    k_cost0   double precision[];
    k_step0   double precision[];
    k_est0    double precision[];
    k_cur0    integer[];
    k_hc0     boolean[];
    k_hd0     timestamptz[];
    k_hi0     bigint[];
    g_pass0   double precision[];
    g_kc0     double precision[];
    -- The kept keys that sit out (their head refused).
    k_out     boolean[];
    -- The refused heads a claim may reach before its row: the ones above
    -- p_above (the first v_nseed), then the ones the check refused. Each
    -- with its quota key and why, its priority, its group (a kept group's
    -- index, whose figures move with the replay, else 0 and the group's
    -- pass and key clock as read), its key's pass and its band, due time.
    b_id      bigint[] := '{}';
    b_qk      text[] := '{}';
    b_why     text[] := '{}';
    b_prio    integer[] := '{}';
    b_grp     text[] := '{}';
    b_gi      integer[] := '{}';
    b_gpass   double precision[] := '{}';
    b_kc      double precision[] := '{}';
    b_kpass   double precision[] := '{}';
    b_cont    boolean[] := '{}';
    b_due     timestamptz[] := '{}';
    v_nseed   integer;
    -- Of one claim: the refused heads before its row, with their lags.
    v_bx      integer[];
    v_bgx     double precision[];
    v_bkx     double precision[];
    v_rgl     double precision;
    v_rkl     double precision;
    v_rg      integer;
    v_ref     jsonb;
    v_stop    jsonb;
    s_ref     jsonb[] := '{}';
    -- The quota keys known to be refused (the plan's), how many there were
    -- when the check began; the rows the plan reached (by index into r_*),
    -- the rows asked to lock and those locked, the quota keys read.
    v_kr      text[];
    v_kr0     integer;
    v_pick    integer[] := '{}';
    v_newr    integer[];
    v_req     bigint[] := '{}';
    v_asked   text[] := '{}';
    v_check   boolean := false;
    v_round   integer := 0;
    v_stopped text;
    v_qkey    text;
    v_why     text;
    v_qwhy    text[] := '{}';
    r_out     harvest_claimed;
BEGIN
    SELECT coalesce(max(q.group_clock), 0) INTO v_gclock0 FROM fair_queues q WHERE q.queue = p_queue;

    -- 0. What the batch's claim before this step refused (p_ref), when it
    -- took a row of priority p_above: every key whose head is above that
    -- priority sits out, its head reported first by every claim (see 3).
    v_kr := '{}';
    IF jsonb_array_length(p_ref) > 0 THEN
        v_kr := ARRAY(SELECT DISTINCT e->>'quota_key' FROM jsonb_array_elements(p_ref) e);
    END IF;
    IF p_above IS NOT NULL THEN
        FOR r_head IN
            SELECT f.key, f.pass, f.head_prio, h.id, h.state, h.priority, h.quota_key, h.continuation, h.due_at,
                   g.pass AS gpass, coalesce(g.key_clock, 0) AS kc
            FROM fair_state f
            -- Each head by a probe of its own (harvest_fair_fold says why).
            LEFT JOIN LATERAL (SELECT x.id, x.state, x.priority, x.quota_key, x.continuation, x.due_at
                               FROM tasks x WHERE x.id = f.head_id OFFSET 0) h ON true
            LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                               WHERE g0.queue = p_queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
            WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.head_prio > p_above
        LOOP
            v_why := (SELECT e->>'reason' FROM jsonb_array_elements(p_ref) e
                      WHERE e->>'quota_key' = r_head.quota_key LIMIT 1);
            IF r_head.id IS NULL OR r_head.state <> 'pending' OR r_head.priority <> r_head.head_prio
               OR r_head.due_at > v_due_cut OR v_why IS NULL THEN
                RETURN;
            END IF;
            b_id := array_append(b_id, r_head.id);
            b_qk := array_append(b_qk, r_head.quota_key);
            b_why := array_append(b_why, v_why);
            b_prio := array_append(b_prio, r_head.priority);
            b_grp := array_append(b_grp, split_part(r_head.key, '/', 1));
            b_gpass := array_append(b_gpass, r_head.gpass);
            b_kc := array_append(b_kc, r_head.kc);
            b_kpass := array_append(b_kpass, r_head.pass);
            b_cont := array_append(b_cont, r_head.continuation);
            b_due := array_append(b_due, r_head.due_at);
        END LOOP;
    END IF;
    v_nseed := cardinality(b_id);

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
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND (p_above IS NULL OR f.head_prio <= p_above)
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
    -- The seeds' groups: a kept group's figures move with the replay.
    FOR v_i IN 1..v_nseed LOOP
        b_gi[v_i] := coalesce(array_position(g_name, b_grp[v_i]), 0);
    END LOOP;
    v_locked := '{}';
    k_pass0 := k_pass;
    k_cost0 := k_cost;
    k_step0 := k_step;
    k_est0 := k_est;
    k_cur0 := k_cur;
    k_hc0 := k_hc;
    k_hd0 := k_hd;
    k_hi0 := k_hi;
    g_pass0 := g_pass;
    g_kc0 := g_kc;

    -- 3, 4. The replay, as the plan (v_check false) and then as the check.
    LOOP
        k_pass := k_pass0;
        k_cost := k_cost0;
        k_step := k_step0;
        k_est := k_est0;
        k_cur := k_cur0;
        g_pass := g_pass0;
        g_kc := g_kc0;
        k_hc := k_hc0;
        k_hd := k_hd0;
        k_hi := k_hi0;
        k_out := array_fill(false, ARRAY[v_nk]);
        g_xpos := array_fill(0, ARRAY[v_g]);
        v_xgpos := 0;
        v_gclock := v_gclock0;
        v_clock := v_clock0;
        v_gi := 0;
        v_k := 0;
        s_k := '{}';
        s_r := '{}';
        s_lag := '{}';
        s_kst := '{}';
        s_kps := '{}';
        s_cost := '{}';
        s_gst := '{}';
        s_gps := '{}';
        s_kc := '{}';
        s_gclock := '{}';
        s_clock := '{}';
        s_ref := '{}';
        v_stopped := NULL;
        v_stop := NULL;
        IF v_check THEN
            b_id := b_id[1:v_nseed];
            b_qk := b_qk[1:v_nseed];
            b_why := b_why[1:v_nseed];
            b_prio := b_prio[1:v_nseed];
            b_gi := b_gi[1:v_nseed];
            b_gpass := b_gpass[1:v_nseed];
            b_kc := b_kc[1:v_nseed];
            b_kpass := b_kpass[1:v_nseed];
            b_cont := b_cont[1:v_nseed];
            b_due := b_due[1:v_nseed];
            v_qacc := array_fill(0, ARRAY[cardinality(v_qk)]);
            v_qtok := v_qtok0;
            v_qwhy := array_fill(NULL::text, ARRAY[cardinality(v_qk)]);
            v_kr0 := cardinality(v_kr);
        ELSE
            v_pick := '{}';
        END IF;
        LOOP
            -- What the groups v_gi (all at first, then the one just charged
            -- or whose key just sat out) compete with now: each group first
            -- competes with its best kept key, or with the bound of its
            -- keys left out when that bound is not after it.
            v_lo := CASE WHEN v_gi = 0 THEN 1 ELSE v_gi END;
            v_hi := CASE WHEN v_gi = 0 THEN v_g ELSE v_gi END;
            FOR v_i IN v_lo..v_hi LOOP
                g_best[v_i] := 0;
                g_bi[v_i] := NULL;
                FOR v_ki IN g_k0[v_i]..g_k1[v_i] LOOP
                    CONTINUE WHEN k_hi[v_ki] IS NULL OR k_out[v_ki];
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
            -- A key left out may come first in the group, or the key's head
            -- is stale.
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
            v_qkey := r_qk[v_ri];
            v_ref := '[]';
            IF NOT v_check THEN
                -- The plan: a head of a quota key known to be refused sits
                -- out; every row reached is locked before the check.
                v_pick := array_append(v_pick, v_ri);
                IF v_qkey = ANY (v_kr) THEN
                    k_out[v_ki] := true;
                    CONTINUE;
                END IF;
            ELSE
                -- The check: only rows locked, of quota keys read.
                IF NOT (r_id[v_ri] = ANY (v_locked)) OR (v_qkey <> '' AND NOT (v_qkey = ANY (v_asked))) THEN
                    v_stopped := 'unread';
                    EXIT;
                END IF;
                -- The recheck (a quota key refused once stays refused).
                v_why := NULL;
                v_qi := CASE WHEN v_qkey = '' THEN NULL ELSE array_position(v_qk, v_qkey) END;
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
                END IF;
                IF v_why IS NOT NULL THEN
                    -- Refused: the key sits out, and the claim reaches the
                    -- next head.
                    k_out[v_ki] := true;
                    b_id := array_append(b_id, r_id[v_ri]);
                    b_qk := array_append(b_qk, v_qkey);
                    b_why := array_append(b_why, v_why);
                    b_prio := array_append(b_prio, v_prio);
                    b_gi := array_append(b_gi, v_gi);
                    b_gpass := array_append(b_gpass, NULL::double precision);
                    b_kc := array_append(b_kc, NULL::double precision);
                    b_kpass := array_append(b_kpass, k_pass[v_ki]);
                    b_cont := array_append(b_cont, r_cont[v_ri]);
                    b_due := array_append(b_due, r_due[v_ri]);
                    IF NOT (v_qkey = ANY (v_kr)) THEN
                        v_kr := array_append(v_kr, v_qkey);
                    END IF;
                    CONTINUE;
                END IF;
                -- The claim's refusals: the refused heads that sort before
                -- its row in its order (lags at the clocks before it), the
                -- first of each quota key.
                IF cardinality(b_id) > 0 THEN
                    v_bx := '{}';
                    v_bgx := '{}';
                    v_bkx := '{}';
                    FOR v_j IN 1..cardinality(b_id) LOOP
                        v_rg := b_gi[v_j];
                        IF v_rg > 0 THEN
                            v_rgl := harvest_lag(g_pass[v_rg], v_gclock);
                            v_rkl := harvest_lag(b_kpass[v_j], g_kc[v_rg]);
                        ELSE
                            v_rgl := harvest_lag(b_gpass[v_j], v_gclock);
                            v_rkl := harvest_lag(b_kpass[v_j], b_kc[v_j]);
                        END IF;
                        IF (-b_prio[v_j], v_rgl, v_rkl, NOT b_cont[v_j], b_due[v_j], b_id[v_j])
                           < (-v_prio, v_bgl, g_bkl[v_gi], NOT g_bc[v_gi], g_bd[v_gi], g_bi[v_gi]) THEN
                            v_bx := array_append(v_bx, v_j);
                            v_bgx := array_append(v_bgx, v_rgl);
                            v_bkx := array_append(v_bkx, v_rkl);
                        END IF;
                    END LOOP;
                    IF cardinality(v_bx) = 1 THEN
                        v_ref := jsonb_build_array(jsonb_build_object('task_id', b_id[v_bx[1]],
                                                                      'quota_key', b_qk[v_bx[1]],
                                                                      'reason', b_why[v_bx[1]]));
                    ELSIF cardinality(v_bx) > 1 THEN
                        SELECT jsonb_agg(jsonb_build_object('task_id', x.id, 'quota_key', x.qk, 'reason', x.why)
                                         ORDER BY x.prio DESC, x.gl, x.kl, x.cont DESC, x.due, x.id)
                        INTO v_ref
                        FROM (SELECT DISTINCT ON (b_qk[u.j]) b_id[u.j] AS id, b_qk[u.j] AS qk, b_why[u.j] AS why,
                                     b_prio[u.j] AS prio, u.gl, u.kl, b_cont[u.j] AS cont, b_due[u.j] AS due
                              FROM unnest(v_bx, v_bgx, v_bkx) AS u(j, gl, kl)
                              ORDER BY b_qk[u.j], b_prio[u.j] DESC, u.gl, u.kl, b_cont[u.j] DESC, b_due[u.j],
                                       b_id[u.j]) x;
                        IF jsonb_array_length(v_ref) >= 8 THEN
                            -- The claim ends at its eighth refusal: so does
                            -- the batch.
                            v_stop := (SELECT jsonb_agg(e ORDER BY o)
                                       FROM jsonb_array_elements(v_ref) WITH ORDINALITY AS a(e, o) WHERE o <= 8);
                            v_stopped := 'refused';
                            EXIT;
                        END IF;
                    END IF;
                END IF;
                IF v_qi IS NOT NULL THEN
                    v_qacc[v_qi] := v_qacc[v_qi] + 1;
                    IF v_qrate[v_qi] IS NOT NULL THEN
                        v_qtok[v_qi] := v_qtok[v_qi] - 1;
                    END IF;
                END IF;
            END IF;
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
            s_ref[v_k] := v_ref;
            -- A key charged for the first time bills its estimate from its
            -- next claim on (harvest_charge_terms reads it only once the key
            -- has been charged).
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
                -- No row of the top priority left (or none read, once the
                -- plan is full): the key leaves the replay.
                k_hi[v_ki] := NULL;
            ELSE
                k_hi[v_ki] := r_id[v_j];
                k_hc[v_ki] := r_cont[v_j];
                k_hd[v_ki] := r_due[v_j];
            END IF;
        END LOOP;
        IF v_check THEN
            -- Another plan only when the check stopped at a row the plan
            -- did not lock after a refusal the plan did not know.
            EXIT WHEN v_stopped IS DISTINCT FROM 'unread' OR cardinality(v_kr) = v_kr0 OR v_round >= 2;
            v_round := v_round + 1;
            v_check := false;
            CONTINUE;
        END IF;

        -- Lock the rows the plan reached and no earlier plan asked for,
        -- before any quota row (the single claim's order), waiting as the
        -- single claim waits; after a first check this transaction holds
        -- quota rows, and a row another claimer holds is skipped instead
        -- (waiting for it could close a cycle with an ordinary claim that
        -- holds it and waits for one of those quota rows). A row that left
        -- the pending state or moved is not taken: the check stops before
        -- it (harvest_rows_lock).
        EXIT WHEN v_round = 0 AND cardinality(v_pick) = 0;
        v_newr := ARRAY(SELECT DISTINCT u FROM unnest(v_pick) u WHERE r_id[u] <> ALL (v_req));
        IF cardinality(v_newr) > 0 THEN
            SELECT array_agg(r_id[u] ORDER BY o), array_agg(k_name[r_key[u]] ORDER BY o),
                   array_agg(r_cont[u] ORDER BY o), array_agg(r_due[u] ORDER BY o)
            INTO v_ids, v_pkeys, v_cont, v_due
            FROM unnest(v_newr) WITH ORDINALITY AS n(u, o);
            v_req := v_req || v_ids;
            v_ids := harvest_rows_lock(p_queue, v_prio, v_ids, v_pkeys, v_cont, v_due, v_round > 0);
            -- A row not locked: the new heads are read from the keys'
            -- indexes (5).
            IF coalesce(cardinality(v_ids), 0) < cardinality(v_newr) THEN
                v_cut := true;
            END IF;
            v_locked := coalesce(v_locked, '{}') || coalesce(v_ids, '{}');
            -- The quota rows of the rows locked, locked and read (see
            -- harvest_claim_bulk_fair, 3a): the numbers the rechecks start
            -- from.
            v_qks := ARRAY(SELECT DISTINCT r_qk[u] FROM unnest(v_newr) u
                           WHERE r_qk[u] <> '' AND r_id[u] = ANY (v_ids) AND r_qk[u] <> ALL (v_asked));
            IF cardinality(v_qks) > 0 THEN
                v_asked := v_asked || v_qks;
                FOR r_quota IN SELECT * FROM harvest_bulk_quotas(p_queue, v_qks, v_now) LOOP
                    v_qk := array_append(v_qk, r_quota.quota_key);
                    v_qcap := array_append(v_qcap, r_quota.max_concurrent);
                    v_qrun := array_append(v_qrun, r_quota.running);
                    v_qrate := array_append(v_qrate, r_quota.rate);
                    v_qtok0 := array_append(v_qtok0, r_quota.tokens);
                END LOOP;
            END IF;
        END IF;
        IF v_round = 0 AND cardinality(v_qk) = 0 AND v_nseed = 0 AND cardinality(v_kr) = 0 THEN
            -- Nothing can be refused: the plan stands, up to its first row
            -- not locked.
            FOR v_i IN 1..v_k LOOP
                IF NOT (r_id[s_r[v_i]] = ANY (v_locked)) THEN
                    v_k := v_i - 1;
                    EXIT;
                END IF;
            END LOOP;
            EXIT;
        END IF;
        v_check := true;
    END LOOP;
    IF v_k = 0 THEN
        IF v_stop IS NOT NULL THEN
            r_out.outcome := 'refused';
            r_out.refusals := v_stop;
            RETURN NEXT r_out;
        END IF;
        RETURN;
    END IF;
    v_ids := ARRAY(SELECT r_id[s.r] FROM unnest(s_r[1:v_k]) WITH ORDINALITY AS s(r, o) ORDER BY s.o);
    v_qks := ARRAY(SELECT r_qk[s.r] FROM unnest(s_r[1:v_k]) WITH ORDINALITY AS s(r, o) ORDER BY s.o);

    -- The rechecks' writes for the rows taken: one token per row off each
    -- bucket, taken one at a time as the single claims would.
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

    -- 5. Lease the rows, each with the lag and refusals its single claim
    -- would report.
    IF p_runtime THEN
        v_secs := s_cost[1:v_k];
    END IF;
    v_i := 0;
    FOR r_out IN SELECT * FROM harvest_lease_rows(v_ids, s_lag[1:v_k], p_worker, p_lease, v_secs) LOOP
        v_i := v_i + 1;
        r_out.refusals := coalesce(s_ref[v_i], '[]');
        RETURN NEXT r_out;
    END LOOP;

    -- Each key's last claim of the plan sets its state; its head moves on
    -- to the row read after the one taken, or, when none was read or a
    -- row of the plan was not locked, to the row the key's index gives.
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
    -- The claim after the last row taken would have reached 8 refusals.
    IF v_stop IS NOT NULL THEN
        r_out := NULL;
        r_out.outcome := 'refused';
        r_out.refusals := v_stop;
        RETURN NEXT r_out;
    END IF;
END
$$;
