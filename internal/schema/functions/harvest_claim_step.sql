-- One claim from one queue, for a caller that has done what a claim does
-- once per statement: for a fair claim, taken the queue's fair lock and
-- folded its arrivals (harvest_claim, harvest_claim_batch).
--   p_now NULL: the database clock (transaction start). Leases always use
--   the database clock.
--   p_task_id: claim that row only (dispatch channel).
--
-- Rows a fair claim wants are locked waiting, not skipped: the only other
-- holders of a pending row are ordinary claims and cancels (fair claims of
-- the queue take turns on the queue's lock), all short, and skipping would
-- let the claim take a row the fair order puts later. The ordinary claim is
-- the plain first unlocked row of the seek index, as without fairness.
--
-- A queue's fairness modes (queue_fairness) change the fair claim: in a
-- two-level queue the keys are compared by their group's lag among the
-- groups first (fair_groups, clock fair_queues.group_clock), then by their
-- own lag against the group's key clock (2g, 2h, and the extra terms of
-- 1 and 2d); in a queue charged by runtime a claim costs the key's runtime
-- estimate instead of 1, and the row records it (charged_secs) for the
-- settlement when the attempt ends (harvest_task_held).
CREATE OR REPLACE FUNCTION harvest_claim_step(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                              p_aging integer, p_lease interval, p_task_id bigint)
RETURNS harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    -- Rows in the pending state are due: they became pending at or after
    -- their due time. With the database clock a claim may see a row that
    -- committed after its own start (now() is the transaction's start), so
    -- only a caller-given time filters on due_at.
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_excl    text[] := '{}';
    v_ref     jsonb := '[]';
    v_nref    integer := 0;
    v_clock   double precision;
    v_gclock  double precision := 0;
    v_two     boolean := false;
    v_runtime boolean := false;
    v_cost    double precision := 1;
    v_lag     double precision;
    v_sort    boolean := false;
    v_lag_set boolean;
    v_reason  text;
    v_running integer;
    v_tokens  double precision;
    v_cand    bigint;
    v_cands   bigint[];
    v_use_a   boolean;
    r_task    tasks%ROWTYPE;
    r_a       fair_state%ROWTYPE;
    r_b       fair_state%ROWTYPE;
    r_k       fair_state%ROWTYPE;
    r_head    record;
    r_quota   quotas%ROWTYPE;
    r_bucket  rate_buckets%ROWTYPE;
    r_out     harvest_claimed;
BEGIN
    IF p_fair THEN
        v_clock := harvest_clock(p_queue);
        SELECT m.two_level, m.runtime INTO v_two, v_runtime FROM harvest_fair_mode(p_queue) m;
        IF v_two THEN
            SELECT coalesce(max(q.group_clock), 0) INTO v_gclock FROM fair_queues q WHERE q.queue = p_queue;
        END IF;
    END IF;
    LOOP
        r_task := NULL;
        v_cand := NULL;
        v_lag := 0;
        v_lag_set := false;

        IF p_task_id IS NOT NULL THEN
            -- Dispatch: the named row only, if it is still pending and due.
            SELECT * INTO r_task FROM tasks x
            WHERE x.id = p_task_id AND x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
            FOR UPDATE SKIP LOCKED;
        ELSE
            -- 1. Rows pinned to this worker come first (rare: own index).
            IF p_worker <> '' THEN
                SELECT x.* INTO r_task FROM tasks x
                LEFT JOIN fair_state f ON p_fair AND f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
                LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE v_two AND g0.queue = x.queue AND g0.grp = split_part(x.fairness_key, '/', 1) LIMIT 1) g ON true
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
                  AND x.sticky_until > v_now AND x.due_at <= v_due_cut
                  AND x.quota_key <> ALL (v_excl)
                ORDER BY x.priority + CASE WHEN p_aging > 0 THEN harvest_us(v_now, x.due_at) / (p_aging::bigint * 1000000) ELSE 0 END DESC,
                         CASE WHEN g.pass IS NULL THEN 0 ELSE greatest(g.pass, v_gclock) - v_gclock END,
                         CASE WHEN f.pass IS NULL THEN 0
                              WHEN v_two THEN greatest(f.pass, coalesce(g.key_clock, 0)) - coalesce(g.key_clock, 0)
                              ELSE greatest(f.pass, v_clock) - v_clock END,
                         x.continuation DESC, x.due_at, x.id
                LIMIT 1
                FOR UPDATE OF x SKIP LOCKED;
            END IF;

            IF r_task.id IS NOT NULL THEN
                NULL;
            ELSIF NOT p_fair AND p_aging = 0 THEN
                -- 2a. Ordinary: the first unlocked row of the seek index.
                SELECT * INTO r_task FROM tasks x
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
                  AND x.quota_key <> ALL (v_excl)
                ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
            ELSIF NOT p_fair AND NOT v_sort THEN
                -- 2b. Ordinary with ageing, without a sort of the backlog.
                -- Inside one priority level the oldest row has the largest
                -- boost, so the level's best effective priority comes from
                -- its oldest due row; the rows that reach the overall best
                -- E in level p are those due at or before
                -- now - (E - p) * ageing. Levels are found by a loose scan
                -- of the seek index; each level costs a few descents. The
                -- first rows of each best level are read without locks and
                -- only the first one no other claimer holds is locked, so
                -- the claim holds no row it does not take.
                EXECUTE $sql$
                SELECT array_agg(c.id ORDER BY c.continuation DESC, c.due_at, c.id)
                FROM (
                    WITH RECURSIVE lv(p) AS (
                        (SELECT y.priority FROM tasks y
                         WHERE y.queue = $1 AND y.state = 'pending'
                         ORDER BY y.priority DESC LIMIT 1)
                        UNION ALL
                        SELECT (SELECT y.priority FROM tasks y
                                WHERE y.queue = $1 AND y.state = 'pending' AND y.priority < lv.p
                                ORDER BY y.priority DESC LIMIT 1)
                        FROM lv WHERE lv.p IS NOT NULL
                    ), m AS (
                        SELECT lv.p, lv.p + harvest_us($2, d.due) / ($3::bigint * 1000000) AS eff
                        FROM lv CROSS JOIN LATERAL (SELECT least(
                            (SELECT y.due_at FROM tasks y
                             WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = lv.p AND y.continuation
                               AND y.due_at <= $5 AND y.quota_key <> ALL ($4)
                             ORDER BY y.due_at, y.id LIMIT 1),
                            (SELECT y.due_at FROM tasks y
                             WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = lv.p AND NOT y.continuation
                               AND y.due_at <= $5 AND y.quota_key <> ALL ($4)
                             ORDER BY y.due_at, y.id LIMIT 1)) AS due) d
                        WHERE lv.p IS NOT NULL AND d.due IS NOT NULL
                    ), top AS (
                        SELECT m.p, $2 - ((max(m.eff) OVER () - m.p) * $3::bigint * 1000000) * interval '1 microsecond' AS hi,
                               m.eff = max(m.eff) OVER () AS best
                        FROM m
                    )
                    SELECT z.id, z.continuation, z.due_at
                    FROM top
                    CROSS JOIN LATERAL (
                        (SELECT y.id, y.continuation, y.due_at FROM tasks y
                         WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND y.continuation
                           AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
                         ORDER BY y.due_at, y.id LIMIT 4)
                        UNION ALL
                        (SELECT y.id, y.continuation, y.due_at FROM tasks y
                         WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND NOT y.continuation
                           AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
                         ORDER BY y.due_at, y.id LIMIT 4)) z
                    WHERE top.best
                ) c
                $sql$ INTO v_cands USING p_queue, v_now, p_aging, v_excl, v_due_cut;
                IF v_cands IS NOT NULL THEN
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = ANY (v_cands) AND x.state = 'pending'
                    ORDER BY array_position(v_cands, x.id)
                    LIMIT 1 FOR UPDATE SKIP LOCKED;
                END IF;
                IF r_task.id IS NULL AND EXISTS (SELECT 1 FROM tasks y
                              WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                                AND y.quota_key <> ALL (v_excl)) THEN
                    -- The best rows are all held by other claimers: the
                    -- full sort below skips them properly.
                    v_sort := true;
                    CONTINUE;
                END IF;
            ELSIF NOT p_fair THEN
                -- 2c. Ordinary with ageing whose best rows are held: the
                -- full sort, skipping held rows.
                EXECUTE $sql$
                    SELECT x.* FROM tasks x
                    WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $5
                      AND x.quota_key <> ALL ($4)
                    ORDER BY x.priority + harvest_us($2, x.due_at) / ($3::bigint * 1000000) DESC,
                             x.continuation DESC, x.due_at, x.id
                    LIMIT 1
                    FOR UPDATE OF x SKIP LOCKED
                    $sql$ INTO r_task USING p_queue, v_now, p_aging, v_excl, v_due_cut;
            ELSIF p_aging > 0 OR v_sort THEN
                -- 2d. Fair, full sort: ageing moves rows between priority
                -- levels inside every key, so the key heads cannot answer.
                -- The sort reads no lock (so the planner keeps only the best
                -- row), then the row is locked, waiting for a short holder.
                EXECUTE $sql$
                    SELECT x.id FROM tasks x
                    LEFT JOIN fair_state f ON f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
                    LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE $7 AND g0.queue = x.queue AND g0.grp = split_part(x.fairness_key, '/', 1) LIMIT 1) g ON true
                    WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $5
                      AND x.quota_key <> ALL ($4)
                    ORDER BY x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END DESC,
                             CASE WHEN g.pass IS NULL THEN 0 ELSE greatest(g.pass, $8) - $8 END,
                             CASE WHEN f.pass IS NULL THEN 0
                                  WHEN $7 THEN greatest(f.pass, coalesce(g.key_clock, 0)) - coalesce(g.key_clock, 0)
                                  ELSE greatest(f.pass, $6) - $6 END,
                             x.continuation DESC, x.due_at, x.id
                    LIMIT 1
                    $sql$ INTO v_cand USING p_queue, v_now, p_aging, v_excl, v_due_cut, v_clock, v_two, v_gclock;
            ELSIF v_two AND cardinality(v_excl) > 0 THEN
                -- 2h. Two-level after a refusal: each key's first row that
                -- no refusal excluded, read from its index (one descent per
                -- key with work), compared as in 2g.
                v_cand := (
                    SELECT h.id FROM fair_state f
                    LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
                    CROSS JOIN LATERAL (
                        SELECT y.id, y.priority, y.continuation, y.due_at FROM tasks y
                        WHERE y.queue = f.queue AND y.fairness_key = f.key AND y.state = 'pending'
                          AND y.due_at <= v_due_cut AND y.quota_key <> ALL (v_excl)
                        ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                        LIMIT 1) h
                    WHERE f.queue = p_queue AND f.head_id IS NOT NULL
                    ORDER BY h.priority DESC,
                             CASE WHEN g.pass IS NULL THEN 0 ELSE greatest(g.pass, v_gclock) - v_gclock END,
                             CASE WHEN f.pass IS NULL THEN 0
                                  ELSE greatest(f.pass, coalesce(g.key_clock, 0)) - coalesce(g.key_clock, 0) END,
                             h.continuation DESC, h.due_at, h.id
                    LIMIT 1);
                IF v_cand IS NULL AND EXISTS (SELECT 1 FROM tasks y
                        WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                          AND y.quota_key <> ALL (v_excl)) THEN
                    -- Due work of a key without a head (a lost summary):
                    -- the sort serves it.
                    v_sort := true;
                    CONTINUE;
                END IF;
            ELSIF v_two THEN
                -- 2g. Two-level: the keys' heads compared by priority, then
                -- the group's lag among the groups, then the key's lag
                -- against its group's key clock. Every key with work is
                -- read (no index orders by the group's lag), so a claim
                -- costs in proportion to the queue's keys. The head is
                -- checked and repaired as in 2f.
                SELECT f.* INTO r_k FROM fair_state f
                LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
                WHERE f.queue = p_queue AND f.head_id IS NOT NULL
                ORDER BY f.head_prio DESC,
                         CASE WHEN g.pass IS NULL THEN 0 ELSE greatest(g.pass, v_gclock) - v_gclock END,
                         CASE WHEN f.pass IS NULL THEN 0
                              ELSE greatest(f.pass, coalesce(g.key_clock, 0)) - coalesce(g.key_clock, 0) END,
                         f.head_cont DESC, f.head_due, f.head_id
                LIMIT 1;
                IF r_k.key IS NOT NULL THEN
                    IF r_k.head_due > v_due_cut THEN
                        v_sort := true;
                        CONTINUE;
                    END IF;
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = r_k.head_id AND x.state = 'pending' AND x.queue = p_queue
                      AND x.fairness_key = r_k.key AND x.priority = r_k.head_prio
                      AND x.continuation = r_k.head_cont AND x.due_at = r_k.head_due
                    FOR UPDATE;
                    IF r_task.id IS NULL THEN
                        SELECT * INTO r_head FROM harvest_key_head(p_queue, r_k.key, r_k.head_prio, r_k.head_cont,
                                                                   r_k.head_due, r_k.head_id);
                        UPDATE fair_state SET head_id = r_head.head_id, head_prio = r_head.head_prio,
                                              head_cont = r_head.head_cont, head_due = r_head.head_due
                        WHERE queue = p_queue AND key = r_k.key;
                        CONTINUE;
                    END IF;
                ELSIF EXISTS (SELECT 1 FROM tasks y WHERE y.queue = p_queue AND y.state = 'pending') THEN
                    v_sort := true;
                    CONTINUE;
                END IF;
            ELSIF cardinality(v_excl) > 0 THEN
                -- 2e. Fair after a refusal: a refused quota key can hide
                -- rows inside a key, so each key's first row that is not
                -- excluded is read from its index (one descent per key with
                -- work, plus the excluded rows it steps over), and the keys
                -- are compared on those rows.
                v_cand := (
                    SELECT h.id FROM fair_state f
                    CROSS JOIN LATERAL (
                        SELECT y.id, y.priority, y.continuation, y.due_at FROM tasks y
                        WHERE y.queue = f.queue AND y.fairness_key = f.key AND y.state = 'pending'
                          AND y.due_at <= v_due_cut AND y.quota_key <> ALL (v_excl)
                        ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                        LIMIT 1) h
                    WHERE f.queue = p_queue AND f.head_id IS NOT NULL
                    ORDER BY h.priority DESC,
                             CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, v_clock) - v_clock END,
                             h.continuation DESC, h.due_at, h.id
                    LIMIT 1);
            ELSE
                -- 2f. Fair: the best key without debt (lag 0, by its head)
                -- against the best key in debt (head priority, then pass),
                -- one index descent each. Priority still comes first.
                SELECT * INTO r_a FROM fair_state
                WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt
                ORDER BY head_prio DESC, head_cont DESC, head_due, head_id
                LIMIT 1;
                SELECT * INTO r_b FROM fair_state
                WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt
                ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id
                LIMIT 1;
                IF r_b.key IS NOT NULL AND r_b.pass <= v_clock THEN
                    -- A debt mark the clock already passed (only a repair
                    -- or a hand edit leaves one): such a key has no debt
                    -- and must compete by its head, so clear the marks the
                    -- clock passed and look again.
                    UPDATE fair_state SET in_debt = false
                    WHERE queue = p_queue AND in_debt AND pass <= v_clock;
                    CONTINUE;
                END IF;
                IF r_a.key IS NOT NULL OR r_b.key IS NOT NULL THEN
                    v_use_a := r_b.key IS NULL OR (r_a.key IS NOT NULL AND
                        (-r_a.head_prio, 0::double precision, NOT r_a.head_cont, r_a.head_due, r_a.head_id)
                        <= (-r_b.head_prio, greatest(r_b.pass, v_clock) - v_clock, NOT r_b.head_cont, r_b.head_due, r_b.head_id));
                    IF v_use_a THEN
                        r_k := r_a;
                    ELSE
                        r_k := r_b;
                    END IF;
                    IF r_k.head_due > v_due_cut THEN
                        -- Only with a caller-given time that went back: the
                        -- sort answers what is due then.
                        v_sort := true;
                        CONTINUE;
                    END IF;
                    -- After the fold no pending row of the key comes before
                    -- its head, so a head that is still pending where the
                    -- summary says is the key's first row. One that left the
                    -- pending state or moved (an ordinary claim, a cancel,
                    -- an update took it) is repaired from the key's index,
                    -- and the keys are compared again.
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = r_k.head_id AND x.state = 'pending' AND x.queue = p_queue
                      AND x.fairness_key = r_k.key AND x.priority = r_k.head_prio
                      AND x.continuation = r_k.head_cont AND x.due_at = r_k.head_due
                    FOR UPDATE;
                    IF r_task.id IS NULL THEN
                        SELECT * INTO r_head FROM harvest_key_head(p_queue, r_k.key, r_k.head_prio, r_k.head_cont,
                                                                   r_k.head_due, r_k.head_id);
                        UPDATE fair_state SET head_id = r_head.head_id, head_prio = r_head.head_prio,
                                              head_cont = r_head.head_cont, head_due = r_head.head_due
                        WHERE queue = p_queue AND key = r_k.key;
                        CONTINUE;
                    END IF;
                    v_lag := CASE WHEN v_use_a THEN 0 ELSE greatest(r_k.pass, v_clock) - v_clock END;
                    v_lag_set := true;
                ELSIF EXISTS (SELECT 1 FROM tasks y WHERE y.queue = p_queue AND y.state = 'pending') THEN
                    -- Due work without a head can only be work whose
                    -- summary was lost (a bulk load with the triggers off,
                    -- a hand edit); the sort serves it until a repair
                    -- (harvest_fair_repair) restores the summary.
                    v_sort := true;
                    CONTINUE;
                END IF;
            END IF;

            IF v_cand IS NOT NULL AND r_task.id IS NULL THEN
                -- A fair pick: lock the row, waiting for a holder (a cancel,
                -- an ordinary claim) to finish, and look again if it left
                -- the pending state meanwhile.
                SELECT * INTO r_task FROM tasks x
                WHERE x.id = v_cand AND x.state = 'pending'
                FOR UPDATE;
                CONTINUE WHEN r_task.id IS NULL;
            END IF;
        END IF;

        IF r_task.id IS NULL THEN
            r_out.outcome := CASE WHEN v_nref > 0 THEN 'refused' ELSE 'no_task' END;
            r_out.refusals := v_ref;
            RETURN r_out;
        END IF;

        IF p_fair AND NOT v_lag_set AND v_two THEN
            SELECT CASE WHEN f.pass IS NULL THEN 0
                        ELSE greatest(f.pass, coalesce(g.key_clock, 0)) - coalesce(g.key_clock, 0) END INTO v_lag
            FROM fair_state f
            LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
            WHERE f.queue = p_queue AND f.key = r_task.fairness_key;
            v_lag := coalesce(v_lag, 0);
        ELSIF p_fair AND NOT v_lag_set THEN
            SELECT CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, v_clock) - v_clock END INTO v_lag
            FROM fair_state f WHERE f.queue = p_queue AND f.key = r_task.fairness_key;
            v_lag := coalesce(v_lag, 0);
        END IF;

        -- 3. Post-claim rechecks of the row's quota key. The quota row's lock
        -- serialises the claims of one quota key until commit, so a cap is
        -- never exceeded by claimers racing on the count.
        v_reason := NULL;
        IF r_task.quota_key <> '' THEN
            SELECT * INTO r_quota FROM quotas
            WHERE queue = p_queue AND quota_key = r_task.quota_key
            FOR NO KEY UPDATE;
            IF FOUND THEN
                IF r_quota.max_concurrent IS NOT NULL THEN
                    SELECT count(*) INTO v_running FROM tasks x
                    WHERE x.queue = p_queue AND x.quota_key = r_task.quota_key AND x.quota_key <> ''
                      AND x.state = 'running';
                    IF v_running >= r_quota.max_concurrent THEN
                        v_reason := 'concurrency_cap';
                    END IF;
                END IF;
                IF v_reason IS NULL AND r_quota.rate IS NOT NULL THEN
                    SELECT * INTO r_bucket FROM rate_buckets
                    WHERE queue = p_queue AND quota_key = r_task.quota_key
                    FOR NO KEY UPDATE;
                    IF FOUND THEN
                        v_tokens := least(r_quota.burst,
                            r_bucket.tokens + r_quota.rate * harvest_secs(greatest(harvest_us(v_now, r_bucket.updated_at), 0)));
                    ELSE
                        v_tokens := r_quota.burst;
                    END IF;
                    IF v_tokens < 1 THEN
                        v_reason := 'rate_limit';
                    ELSE
                        INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at)
                        VALUES (p_queue, r_task.quota_key, v_tokens - 1, v_now)
                        ON CONFLICT (queue, quota_key) DO UPDATE
                        SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at;
                    END IF;
                END IF;
            END IF;
        END IF;
        IF v_reason IS NOT NULL THEN
            v_ref := v_ref || jsonb_build_array(jsonb_build_object(
                'task_id', r_task.id, 'quota_key', r_task.quota_key, 'reason', v_reason));
            v_nref := v_nref + 1;
            v_excl := v_excl || r_task.quota_key;
            IF v_nref >= 8 OR p_task_id IS NOT NULL THEN
                r_out.outcome := 'refused';
                r_out.refusals := v_ref;
                RETURN r_out;
            END IF;
            CONTINUE;
        END IF;

        -- 4. Lease the row (database clock) and mark the run running. In a
        -- queue charged by runtime a fair claim bills the key's estimate
        -- (1 s until one of its attempts has ended) and the row keeps it.
        IF p_fair AND v_runtime THEN
            SELECT f.held_est INTO v_cost FROM fair_state f
            WHERE f.queue = p_queue AND f.key = r_task.fairness_key AND f.charged_at IS NOT NULL;
            v_cost := coalesce(v_cost, 1);
        END IF;
        UPDATE tasks SET
            state            = 'running',
            attempt          = attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = clock_timestamp(),
            charged_secs     = CASE WHEN p_fair AND v_runtime THEN v_cost END
        WHERE id = r_task.id
        RETURNING * INTO r_task;
        UPDATE runs SET
            status     = 'running',
            attempts   = attempts + 1,
            -- The task's stamp, not now(): a claim that waited for the
            -- queue lock began before the claim that held it.
            claimed_at = coalesce(claimed_at, r_task.claimed_at)
        WHERE pk = r_task.run_pk AND status IN ('queued', 'running');

        -- 5. Charge the key (fair claims only); the key's head moves on when
        -- this row was it.
        IF p_fair THEN
            PERFORM harvest_charge(p_queue, r_task.fairness_key, v_now, r_task.id, v_clock, v_cost, v_two);
        END IF;

        r_out := ROW('ok', v_lag, v_ref, r_task.id, r_task.run_pk, r_task.queue, r_task.fairness_key,
                     r_task.quota_key, r_task.priority, r_task.continuation, r_task.due_at,
                     r_task.sticky_worker, r_task.sticky_until, r_task.step, r_task.input,
                     r_task.attempt, r_task.lease_token, r_task.lease_expires_at, r_task.trace_context);
        RETURN r_out;
    END LOOP;
END
$$;
