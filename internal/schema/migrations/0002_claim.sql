-- The claim and the task life cycle, as functions so that a claim (pick,
-- rechecks, lease, charge) is one round trip with a bounded refusal loop.
--
-- Error codes raised here (class HA, not used by PostgreSQL itself):
--   HA001  the lease token is not the task's current one (stale lease)
--   HA002  no such task
-- pkg/claim maps them to its sentinel errors.

-- Microseconds from b to a, exactly (epoch values are numeric).
CREATE FUNCTION harvest_us(a timestamptz, b timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM a - b) * 1000000)::bigint
$$;

-- Seconds of a microsecond count, rounded the way Go's Duration.Seconds
-- rounds, so the rate buckets agree with the reference model bit for bit.
CREATE FUNCTION harvest_secs(us bigint) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (us / 1000000)::double precision + ((us % 1000000) * 1000)::double precision / 1e9::double precision
$$;

-- True when row 1 comes before row 2 in the claim order within one key
-- (priority descending, continuation first, due time, id). A missing row 2
-- (id NULL) loses to anything.
CREATE FUNCTION harvest_beats(p1 integer, c1 boolean, d1 timestamptz, i1 bigint,
                              p2 integer, c2 boolean, d2 timestamptz, i2 bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT i2 IS NULL OR (-p1, NOT c1, d1, i1) < (-p2, NOT c2, d2, i2)
$$;

-- A row became due and pending: count it and make it the head of its key if
-- it comes first. ON CONFLICT works on the latest version of the summary, so
-- concurrent inserts cannot lose a head.
CREATE FUNCTION harvest_key_enter(p_queue text, p_key text, p_id bigint, p_prio integer,
                                  p_cont boolean, p_due timestamptz) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO fair_state AS s (queue, key, pending, head_id, head_prio, head_cont, head_due)
    VALUES (p_queue, p_key, 1, p_id, p_prio, p_cont, p_due)
    ON CONFLICT (queue, key) DO UPDATE SET
        pending   = s.pending + 1,
        head_id   = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_id   ELSE s.head_id   END,
        head_prio = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_prio ELSE s.head_prio END,
        head_cont = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_cont ELSE s.head_cont END,
        head_due  = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_due  ELSE s.head_due  END
$$;

-- Re-read the head of a key from the index on pending rows. The caller holds
-- the summary row's lock; as a separate statement this one sees every commit
-- made before that lock was granted.
CREATE FUNCTION harvest_key_refresh(p_queue text, p_key text, p_delta integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r_head record;
BEGIN
    SELECT x.id, x.priority, x.continuation, x.due_at INTO r_head
    FROM tasks x
    WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
    ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
    LIMIT 1;
    UPDATE fair_state SET
        pending   = CASE WHEN r_head.id IS NULL THEN 0 ELSE greatest(pending + p_delta, 1) END,
        head_id   = r_head.id,
        head_prio = r_head.priority,
        head_cont = r_head.continuation,
        head_due  = r_head.due_at
    WHERE queue = p_queue AND key = p_key;
END
$$;

-- A row stopped being pending (claimed, deleted, or changed).
CREATE FUNCTION harvest_key_leave(p_queue text, p_key text, p_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
BEGIN
    SELECT head_id INTO v_head FROM fair_state WHERE queue = p_queue AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_head IS DISTINCT FROM p_id THEN
        UPDATE fair_state SET pending = greatest(pending - 1, 0) WHERE queue = p_queue AND key = p_key;
    ELSE
        PERFORM harvest_key_refresh(p_queue, p_key, -1);
    END IF;
END
$$;

-- Keeps the per-key summary exact whatever statement moves a row in or out
-- of the pending state.
CREATE FUNCTION harvest_tasks_summary() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A fair claim that holds the key's summary row lease the row and
    -- refresh the summary in one update of its own (see harvest_charge).
    IF TG_OP = 'UPDATE' AND current_setting('harvest.summary_owned', true) = OLD.id::text THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' AND OLD.state = 'pending' THEN
        IF TG_OP = 'UPDATE' AND NEW.state = 'pending'
           AND (NEW.queue, NEW.fairness_key, NEW.priority, NEW.continuation, NEW.due_at)
               IS NOT DISTINCT FROM (OLD.queue, OLD.fairness_key, OLD.priority, OLD.continuation, OLD.due_at) THEN
            RETURN NULL;
        END IF;
        PERFORM harvest_key_leave(OLD.queue, OLD.fairness_key, OLD.id);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state = 'pending' THEN
        PERFORM harvest_key_enter(NEW.queue, NEW.fairness_key, NEW.id, NEW.priority, NEW.continuation, NEW.due_at);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_summary
    AFTER INSERT OR DELETE OR UPDATE OF state, queue, fairness_key, priority, continuation, due_at ON tasks
    FOR EACH ROW EXECUTE FUNCTION harvest_tasks_summary();

-- Insert one task: the only insert path. A row due later than now waits in
-- the scheduled state. p_now NULL means the database clock.
CREATE FUNCTION harvest_enqueue(p_run_pk bigint, p_queue text, p_key text, p_quota_key text,
                                p_priority integer, p_continuation boolean, p_due timestamptz,
                                p_sticky_worker text, p_sticky_until timestamptz, p_step integer,
                                p_input jsonb, p_trace jsonb, p_now timestamptz) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                       sticky_worker, sticky_until, step, input, trace_context)
    VALUES (p_run_pk, p_queue, p_key, p_quota_key, p_priority, p_continuation,
            CASE WHEN coalesce(p_due, coalesce(p_now, now())) <= coalesce(p_now, now()) THEN 'pending' ELSE 'scheduled' END,
            coalesce(p_due, coalesce(p_now, now())),
            p_sticky_worker, p_sticky_until, p_step, p_input, p_trace)
    RETURNING id
$$;

-- Promote scheduled rows that are due (of one queue, or of all when p_queue
-- is NULL), at most p_limit of them, skipping rows another promoter holds.
CREATE FUNCTION harvest_promote_due(p_queue text, p_now timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_queue IS NULL THEN
        UPDATE tasks SET state = 'pending'
        WHERE id IN (SELECT x.id FROM tasks x
                     WHERE x.state = 'scheduled' AND x.due_at <= coalesce(p_now, now())
                     ORDER BY x.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    ELSE
        UPDATE tasks SET state = 'pending'
        WHERE id IN (SELECT x.id FROM tasks x
                     WHERE x.state = 'scheduled' AND x.queue = p_queue AND x.due_at <= coalesce(p_now, now())
                     ORDER BY x.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- What a claim hands back: outcome 'ok', 'no_task' or 'refused', the lag of
-- the chosen key (fair claims), the refusals met on the way, and the task.
CREATE TYPE harvest_claimed AS (
    outcome          text,
    lag              double precision,
    refusals         jsonb,
    id               bigint,
    run_pk           bigint,
    queue            text,
    fairness_key     text,
    quota_key        text,
    priority         integer,
    continuation     boolean,
    due_at           timestamptz,
    sticky_worker    text,
    sticky_until     timestamptz,
    step             integer,
    input            jsonb,
    attempt          integer,
    lease_token      uuid,
    lease_expires_at timestamptz,
    trace_context    jsonb
);

-- The queue clock V: the largest last_start of the queue (0 without rows).
CREATE FUNCTION harvest_clock(p_queue text) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT last_start FROM fair_state
                     WHERE queue = p_queue AND charged_at IS NOT NULL
                     ORDER BY last_start DESC LIMIT 1), 0)
$$;

-- Charge a key for an accepted claim: start = max(pass, V) (V for a key
-- without state), last_start = start, pass = start + 1/w. With p_took (the
-- row just leased, when the caller holds the summary row and kept the
-- trigger out) the key's head and count are refreshed in the same update,
-- so a fair claim writes its summary row once. Then clear the in_debt mark
-- of the keys the new clock has caught up with; rows another claimer holds
-- are left for a later charge (a stale mark only costs order under
-- concurrency, never a task).
CREATE FUNCTION harvest_charge(p_queue text, p_key text, p_now timestamptz, p_took bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_clock double precision := harvest_clock(p_queue);
    v_w     double precision := 1;
    v_start double precision;
    r_head  record;
BEGIN
    IF p_key <> '' THEN
        SELECT weight INTO v_w FROM weight_overrides WHERE queue = p_queue AND key = p_key;
        v_w := coalesce(v_w, 1);
    END IF;
    IF p_took IS NULL THEN
        UPDATE fair_state SET
            last_start = CASE WHEN pass IS NULL THEN v_clock ELSE greatest(pass, v_clock) END,
            pass       = CASE WHEN pass IS NULL THEN v_clock ELSE greatest(pass, v_clock) END + 1::double precision / v_w,
            charged_at = p_now,
            in_debt    = true
        WHERE queue = p_queue AND key = p_key
        RETURNING last_start INTO v_start;
    ELSE
        SELECT x.id, x.priority, x.continuation, x.due_at INTO r_head
        FROM tasks x
        WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
        ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
        LIMIT 1;
        UPDATE fair_state SET
            last_start = CASE WHEN pass IS NULL THEN v_clock ELSE greatest(pass, v_clock) END,
            pass       = CASE WHEN pass IS NULL THEN v_clock ELSE greatest(pass, v_clock) END + 1::double precision / v_w,
            charged_at = p_now,
            in_debt    = true,
            pending    = CASE WHEN r_head.id IS NULL THEN 0 ELSE greatest(pending - 1, 1) END,
            head_id    = r_head.id,
            head_prio  = r_head.priority,
            head_cont  = r_head.continuation,
            head_due   = r_head.due_at
        WHERE queue = p_queue AND key = p_key
        RETURNING last_start INTO v_start;
    END IF;
    IF NOT FOUND THEN
        v_start := v_clock;
        INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt)
        VALUES (p_queue, p_key, v_clock + 1::double precision / v_w, v_clock, p_now, true);
    END IF;
    IF v_start > v_clock THEN
        UPDATE fair_state f SET in_debt = false
        FROM (SELECT d.queue, d.key FROM fair_state d
              WHERE d.queue = p_queue AND d.in_debt AND d.pass <= v_start
              FOR UPDATE SKIP LOCKED) c
        WHERE f.queue = c.queue AND f.key = c.key;
    END IF;
END
$$;

-- One claim from one queue.
--   p_now NULL: the database clock (transaction start). Leases always use
--   the database clock.
--   p_task_id: claim that row only (dispatch channel).
--   p_promote: promote due scheduled rows of the queue first.
CREATE FUNCTION harvest_claim(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                              p_aging integer, p_lease interval, p_task_id bigint, p_promote boolean)
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
    v_lag     double precision;
    v_tries   integer := 0;
    v_reason  text;
    v_running integer;
    v_tokens  double precision;
    v_key     text;
    v_use_a   boolean;
    v_cand    bigint;
    r_task    tasks%ROWTYPE;
    r_a       fair_state%ROWTYPE;
    r_b       fair_state%ROWTYPE;
    r_quota   quotas%ROWTYPE;
    r_bucket  rate_buckets%ROWTYPE;
    r_out     harvest_claimed;
BEGIN
    IF p_promote THEN
        PERFORM harvest_promote_due(p_queue, v_now, 1000);
    END IF;
    LOOP
        r_task := NULL;
        v_lag := 0;
        v_key := NULL;
        IF p_fair THEN
            v_clock := harvest_clock(p_queue);
        END IF;

        IF p_task_id IS NOT NULL THEN
            -- Dispatch: the named row only, if it is still pending and due.
            SELECT * INTO r_task FROM tasks x
            WHERE x.id = p_task_id AND x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
            FOR UPDATE SKIP LOCKED;
        END IF;

        -- 1. Rows pinned to this worker come first (rare: own index).
        IF p_task_id IS NULL AND p_worker <> '' THEN
            SELECT x.* INTO r_task FROM tasks x
            LEFT JOIN fair_state f ON p_fair AND f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
            WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
              AND x.sticky_until > v_now AND x.due_at <= v_due_cut
              AND x.quota_key <> ALL (v_excl)
            ORDER BY x.priority + CASE WHEN p_aging > 0 THEN harvest_us(v_now, x.due_at) / (p_aging::bigint * 1000000) ELSE 0 END DESC,
                     CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, v_clock) - v_clock END,
                     x.continuation DESC, x.due_at, x.id
            LIMIT 1
            FOR UPDATE OF x SKIP LOCKED;
        END IF;

        IF p_task_id IS NULL AND r_task.id IS NULL THEN
            IF p_fair AND p_aging = 0 AND cardinality(v_excl) > 0 AND v_tries < 3 THEN
                -- 2d. Fair after a refusal: a refused quota key can hide
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
                IF v_cand IS NOT NULL THEN
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = v_cand AND x.state = 'pending'
                    FOR UPDATE SKIP LOCKED;
                    IF r_task.id IS NULL THEN
                        -- Held by another claimer: the full sort below
                        -- skips held rows properly.
                        v_tries := 3;
                        CONTINUE;
                    END IF;
                END IF;
            ELSIF NOT p_fair AND p_aging > 0 AND v_tries < 3 THEN
                -- 2e. Ordinary with ageing, without a sort of the backlog.
                -- Inside one priority level the oldest row has the largest
                -- boost, so the level's best effective priority comes from
                -- its oldest due row; the rows that reach the overall best
                -- E in level p are those due at or before
                -- now - (E - p) * ageing. Levels are found by a loose scan
                -- of the seek index; each level costs a few descents.
                EXECUTE $sql$
                SELECT c.id
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
                               AND y.due_at <= $7 AND y.quota_key <> ALL ($4)
                             ORDER BY y.due_at, y.id LIMIT 1),
                            (SELECT y.due_at FROM tasks y
                             WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = lv.p AND NOT y.continuation
                               AND y.due_at <= $7 AND y.quota_key <> ALL ($4)
                             ORDER BY y.due_at, y.id LIMIT 1)) AS due) d
                        WHERE lv.p IS NOT NULL AND d.due IS NOT NULL
                    ), top AS (
                        SELECT m.p, $2 - ((max(m.eff) OVER () - m.p) * $3::bigint * 1000000) * interval '1 microsecond' AS hi,
                               m.eff = max(m.eff) OVER () AS best
                        FROM m
                    )
                    SELECT coalesce(zc.id, zn.id) AS id, zc.id IS NOT NULL AS continuation,
                           coalesce(zc.due_at, zn.due_at) AS due_at
                    FROM top
                    LEFT JOIN LATERAL (
                        SELECT y.id, y.due_at FROM tasks y
                        WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND y.continuation
                          AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
                        ORDER BY y.due_at, y.id LIMIT 1 FOR UPDATE SKIP LOCKED) zc ON true
                    LEFT JOIN LATERAL (
                        SELECT y.id, y.due_at FROM tasks y
                        WHERE zc.id IS NULL
                          AND y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND NOT y.continuation
                          AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
                        ORDER BY y.due_at, y.id LIMIT 1 FOR UPDATE SKIP LOCKED) zn ON true
                    WHERE top.best AND coalesce(zc.id, zn.id) IS NOT NULL
                ) c
                ORDER BY c.continuation DESC, c.due_at, c.id
                LIMIT 1
                $sql$ INTO v_cand USING p_queue, v_now, p_aging, v_excl, p_fair, v_clock, v_due_cut;
                IF v_cand IS NOT NULL THEN
                    SELECT * INTO r_task FROM tasks x WHERE x.id = v_cand;
                ELSIF EXISTS (SELECT 1 FROM tasks y
                              WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                                AND y.quota_key <> ALL (v_excl)) THEN
                    -- The best rows are all held by other claimers: the
                    -- full sort below skips them properly.
                    v_tries := 3;
                    CONTINUE;
                END IF;
            ELSIF p_aging > 0 OR (p_fair AND (cardinality(v_excl) > 0 OR v_tries >= 3)) THEN
                -- 2a. The full sort: ageing moves rows between priority
                -- levels inside every key, and refused quota keys hide rows
                -- inside a key, so neither the key heads nor the seek index
                -- can answer. Sorting without a lock lets the planner keep
                -- only the best row (top-N); the row is then locked, and
                -- only if another claimer holds it does the sort run again
                -- with SKIP LOCKED (which has to sort every row).
                EXECUTE $sql$
                    SELECT x.id FROM tasks x
                    LEFT JOIN fair_state f ON $5 AND f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
                    WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $7
                      AND x.quota_key <> ALL ($4)
                    ORDER BY x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END DESC,
                             CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, $6) - $6 END,
                             x.continuation DESC, x.due_at, x.id
                    LIMIT 1
                    $sql$ INTO v_cand USING p_queue, v_now, p_aging, v_excl, p_fair, v_clock, v_due_cut;
                IF v_cand IS NOT NULL THEN
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = v_cand AND x.state = 'pending'
                    FOR UPDATE SKIP LOCKED;
                END IF;
                IF v_cand IS NOT NULL AND r_task.id IS NULL THEN
                    EXECUTE $sql$
                    SELECT x.* FROM tasks x
                    LEFT JOIN fair_state f ON $5 AND f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
                    WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $7
                      AND x.quota_key <> ALL ($4)
                    ORDER BY x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END DESC,
                             CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, $6) - $6 END,
                             x.continuation DESC, x.due_at, x.id
                    LIMIT 1
                    FOR UPDATE OF x SKIP LOCKED
                    $sql$ INTO r_task USING p_queue, v_now, p_aging, v_excl, p_fair, v_clock, v_due_cut;
                END IF;
            ELSIF NOT p_fair THEN
                -- 2b. Ordinary: the first unlocked row of the seek index.
                SELECT * INTO r_task FROM tasks x
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
                  AND x.quota_key <> ALL (v_excl)
                ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
            ELSE
                -- 2c. Fair: the best key without debt (lag 0, by head) and
                -- the best key in debt (by head priority, then pass), each
                -- one index descent on the summary; SKIP LOCKED spreads
                -- concurrent claimers over keys.
                SELECT * INTO r_a FROM fair_state
                WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt
                ORDER BY head_prio DESC, head_cont DESC, head_due, head_id
                LIMIT 1 FOR UPDATE SKIP LOCKED;
                SELECT * INTO r_b FROM fair_state
                WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt
                ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id
                LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF r_a.key IS NULL AND r_b.key IS NULL THEN
                    -- Every key with work is held by another claimer (or
                    -- there is no work): wait for the best one rather than
                    -- come back empty while work exists.
                    SELECT * INTO r_a FROM fair_state
                    WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt
                    ORDER BY head_prio DESC, head_cont DESC, head_due, head_id
                    LIMIT 1 FOR UPDATE;
                    IF r_a.key IS NULL THEN
                        SELECT * INTO r_b FROM fair_state
                        WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt
                        ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id
                        LIMIT 1 FOR UPDATE;
                    END IF;
                END IF;
                IF r_a.key IS NOT NULL OR r_b.key IS NOT NULL THEN
                    v_use_a := r_b.key IS NULL OR (r_a.key IS NOT NULL AND
                        (-r_a.head_prio, 0::double precision, NOT r_a.head_cont, r_a.head_due, r_a.head_id)
                        <= (-r_b.head_prio, greatest(r_b.pass, v_clock) - v_clock, NOT r_b.head_cont, r_b.head_due, r_b.head_id));
                    FOR i IN 1..2 LOOP
                        IF (i = 1) = v_use_a THEN
                            v_key := r_a.key;
                            v_lag := 0;
                        ELSE
                            v_key := r_b.key;
                            v_lag := greatest(r_b.pass, v_clock) - v_clock;
                        END IF;
                        CONTINUE WHEN v_key IS NULL;
                        SELECT * INTO r_task FROM tasks x
                        WHERE x.queue = p_queue AND x.fairness_key = v_key AND x.state = 'pending' AND x.due_at <= v_due_cut
                        ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
                        LIMIT 1 FOR UPDATE SKIP LOCKED;
                        EXIT WHEN r_task.id IS NOT NULL;
                        -- The head was stale or every row of the key is
                        -- held: repair the summary and try the other key.
                        PERFORM harvest_key_refresh(p_queue, v_key, 0);
                    END LOOP;
                    IF r_task.id IS NULL THEN
                        v_tries := v_tries + 1;
                        CONTINUE;
                    END IF;
                END IF;
            END IF;
        END IF;

        IF r_task.id IS NULL THEN
            r_out.outcome := CASE WHEN v_nref > 0 THEN 'refused' ELSE 'no_task' END;
            r_out.refusals := v_ref;
            RETURN r_out;
        END IF;

        IF p_fair AND v_key IS NULL THEN
            SELECT CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, v_clock) - v_clock END INTO v_lag
            FROM fair_state f WHERE f.queue = p_queue AND f.key = r_task.fairness_key;
            v_lag := coalesce(v_lag, 0);
        END IF;

        -- 3. Post-claim rechecks of the row's quota key. The quota row's lock
        -- serialises the claims of one quota key until commit, so a cap is
        -- never exceeded by claimers racing on the count.
        v_reason := NULL;
        IF r_task.quota_key <> '' THEN
            -- Lock order is summary row, then quota row, in every path: a
            -- claim that found its row without the summary takes the
            -- summary row now, which the lease would take anyway.
            IF v_key IS NULL THEN
                PERFORM 1 FROM fair_state
                WHERE queue = p_queue AND key = r_task.fairness_key
                FOR UPDATE;
            END IF;
            SELECT * INTO r_quota FROM quotas
            WHERE queue = p_queue AND quota_key = r_task.quota_key
            FOR NO KEY UPDATE;
            IF FOUND THEN
                IF r_quota.max_concurrent IS NOT NULL THEN
                    SELECT count(*) INTO v_running FROM tasks x
                    WHERE x.queue = p_queue AND x.quota_key = r_task.quota_key AND x.state = 'running';
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

        -- 4. Lease the row (database clock) and mark the run running. When
        -- this claim holds the key's summary row (fair pick by key), the
        -- trigger stays out and the charge refreshes the head instead.
        IF v_key IS NOT NULL THEN
            PERFORM set_config('harvest.summary_owned', r_task.id::text, true);
        END IF;
        UPDATE tasks SET
            state            = 'running',
            attempt          = attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = clock_timestamp()
        WHERE id = r_task.id
        RETURNING * INTO r_task;
        IF v_key IS NOT NULL THEN
            PERFORM set_config('harvest.summary_owned', '', true);
        END IF;
        UPDATE runs SET
            status     = 'running',
            attempts   = attempts + 1,
            claimed_at = coalesce(claimed_at, now())
        WHERE pk = r_task.run_pk AND status IN ('queued', 'running');

        -- 5. Charge the key (fair claims only).
        IF p_fair THEN
            PERFORM harvest_charge(p_queue, r_task.fairness_key, v_now,
                                   CASE WHEN v_key IS NOT NULL THEN r_task.id END);
        END IF;

        r_out := ROW('ok', v_lag, v_ref, r_task.id, r_task.run_pk, r_task.queue, r_task.fairness_key,
                     r_task.quota_key, r_task.priority, r_task.continuation, r_task.due_at,
                     r_task.sticky_worker, r_task.sticky_until, r_task.step, r_task.input,
                     r_task.attempt, r_task.lease_token, r_task.lease_expires_at, r_task.trace_context);
        RETURN r_out;
    END LOOP;
END
$$;

-- Up to p_n claims in one statement, each one charging its key in the fair
-- order. Returns the rows taken; when it stops early with refusals, a last
-- row with outcome 'refused' carries them.
CREATE FUNCTION harvest_claim_batch(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                    p_aging integer, p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    r_out harvest_claimed;
BEGIN
    FOR i IN 1..p_n LOOP
        r_out := harvest_claim(p_queue, p_worker, p_now, p_fair, p_aging, p_lease, NULL, i = 1);
        IF r_out.outcome <> 'ok' THEN
            IF r_out.outcome = 'refused' THEN
                RETURN NEXT r_out;
            END IF;
            RETURN;
        END IF;
        RETURN NEXT r_out;
    END LOOP;
END
$$;

-- The task under lease, locked, or an error when the token is not current.
CREATE FUNCTION harvest_leased(p_id bigint, p_token uuid) RETURNS tasks
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
BEGIN
    SELECT * INTO r_task FROM tasks WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % not found', p_id USING ERRCODE = 'HA002';
    END IF;
    IF r_task.state <> 'running' OR r_task.lease_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'task %: lease token is not current', p_id USING ERRCODE = 'HA001';
    END IF;
    RETURN r_task;
END
$$;

-- A run reached a final state: record it and release the tenant's slot, in
-- the caller's transaction. A run already final is left alone.
CREATE FUNCTION harvest_run_finish(p_run_pk bigint, p_status text, p_output jsonb, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text;
BEGIN
    UPDATE runs SET status = p_status, output = p_output, error = p_error, finished_at = now()
    WHERE pk = p_run_pk AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING tenant INTO v_tenant;
    IF FOUND THEN
        UPDATE tenant_running SET running = running - 1 WHERE tenant = v_tenant AND running > 0;
    END IF;
END
$$;

CREATE FUNCTION harvest_complete(p_id bigint, p_token uuid, p_output jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
BEGIN
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    PERFORM harvest_run_finish(r_task.run_pk, 'completed', p_output, NULL);
END
$$;

-- Fail the attempt. With p_retry_at and attempts left, the task waits for
-- p_retry_at (pending or scheduled) and the run is queued again; otherwise
-- the run fails. Returns true when the task will run again.
CREATE FUNCTION harvest_fail(p_id bigint, p_token uuid, p_error text, p_retry_at timestamptz, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_max  integer;
BEGIN
    SELECT max_attempts INTO v_max FROM runs WHERE pk = r_task.run_pk;
    IF p_retry_at IS NOT NULL AND r_task.attempt < coalesce(v_max, 1) THEN
        UPDATE tasks SET
            state = CASE WHEN p_retry_at <= coalesce(p_now, now()) THEN 'pending' ELSE 'scheduled' END,
            due_at = p_retry_at, lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
        WHERE id = p_id;
        UPDATE runs SET status = 'queued', error = p_error
        WHERE pk = r_task.run_pk AND status = 'running';
        RETURN true;
    END IF;
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    PERFORM harvest_run_finish(r_task.run_pk, 'failed', NULL, p_error);
    RETURN false;
END
$$;

CREATE FUNCTION harvest_heartbeat(p_id bigint, p_token uuid, p_extend interval) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_until timestamptz;
BEGIN
    UPDATE tasks SET lease_expires_at = now() + p_extend WHERE id = r_task.id
    RETURNING lease_expires_at INTO v_until;
    RETURN v_until;
END
$$;

-- Finish this task and enqueue the run's next one in the continuation band,
-- same queue and keys; optionally pinned to the worker that holds the lease
-- until p_sticky_until, and due at p_due. Returns the new task's id.
CREATE FUNCTION harvest_continue(p_id bigint, p_token uuid, p_input jsonb, p_sticky_until timestamptz,
                                 p_due timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_id   bigint;
BEGIN
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    v_id := harvest_enqueue(r_task.run_pk, r_task.queue, r_task.fairness_key, r_task.quota_key,
                            r_task.priority, true, p_due,
                            CASE WHEN p_sticky_until IS NULL THEN NULL ELSE r_task.claimed_by END,
                            p_sticky_until, r_task.step + 1, p_input, r_task.trace_context, p_now);
    RETURN v_id;
END
$$;

-- Put back tasks whose lease expired (database clock), or fail their run
-- when it has used its attempts. A task finished meanwhile is not running
-- any more and is never touched.
CREATE FUNCTION harvest_rescue_expired(p_limit integer, OUT rescued integer, OUT failed integer)
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
    v_max  integer;
BEGIN
    rescued := 0;
    failed := 0;
    FOR r_task IN
        SELECT * FROM tasks
        WHERE state = 'running' AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        SELECT max_attempts INTO v_max FROM runs WHERE pk = r_task.run_pk;
        IF r_task.attempt >= coalesce(v_max, 1) THEN
            UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = r_task.id;
            PERFORM harvest_run_finish(r_task.run_pk, 'failed', NULL,
                format('lease expired on attempt %s of %s', r_task.attempt, v_max));
            failed := failed + 1;
        ELSE
            UPDATE tasks SET state = 'pending', lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
            WHERE id = r_task.id;
            UPDATE runs SET status = 'queued' WHERE pk = r_task.run_pk AND status = 'running';
            rescued := rescued + 1;
        END IF;
    END LOOP;
END
$$;

-- Prune fairness state. A row goes when its key has no pending or scheduled
-- task in the queue, it was last charged at or before p_now - p_window, and
-- it is not the clock row (greatest (last_start, key) of the queue). A queue
-- with no pending or scheduled task and no charge inside the window loses
-- all its rows. Summary rows that never held state and have no work go too,
-- silently. With p_preview the same statement runs on a temporary copy, so
-- no real row is locked. Returns the state rows deleted (or that would be).
-- p_now NULL means the database clock.
CREATE FUNCTION harvest_fair_prune(p_now timestamptz, p_window interval, p_preview boolean)
RETURNS TABLE (queue text, key text)
LANGUAGE plpgsql AS $$
DECLARE
    v_target text := 'public.fair_state';
BEGIN
    p_now := coalesce(p_now, now());
    IF p_preview THEN
        IF to_regclass('pg_temp.harvest_prune_preview') IS NOT NULL THEN
            DROP TABLE pg_temp.harvest_prune_preview;
        END IF;
        CREATE TEMP TABLE harvest_prune_preview ON COMMIT DROP AS SELECT * FROM fair_state;
        v_target := 'pg_temp.harvest_prune_preview';
    END IF;
    RETURN QUERY EXECUTE format($q$
        WITH clock AS (
            SELECT DISTINCT ON (c.queue) c.queue, c.key FROM %1$s c
            WHERE c.charged_at IS NOT NULL
            ORDER BY c.queue, c.last_start DESC, c.key COLLATE "C" DESC
        ), idle AS (
            SELECT g.queue FROM %1$s g
            GROUP BY g.queue
            HAVING coalesce(max(g.charged_at), '-infinity') <= $1 - $2
               AND NOT EXISTS (SELECT 1 FROM tasks x
                               WHERE x.queue = g.queue AND x.state IN ('pending', 'scheduled'))
        ), gone AS (
            DELETE FROM %1$s s
            WHERE s.head_id IS NULL
              AND (s.queue IN (SELECT queue FROM idle)
                   OR ((s.charged_at IS NULL OR s.charged_at <= $1 - $2)
                       AND NOT EXISTS (SELECT 1 FROM tasks x
                                       WHERE x.queue = s.queue AND x.fairness_key = s.key
                                         AND x.state IN ('pending', 'scheduled'))
                       AND (s.queue, s.key) NOT IN (SELECT c.queue, c.key FROM clock c)))
            RETURNING s.queue, s.key, s.charged_at
        )
        SELECT gone.queue, gone.key FROM gone WHERE gone.charged_at IS NOT NULL
        ORDER BY gone.queue COLLATE "C", gone.key COLLATE "C" $q$, v_target)
    USING p_now, p_window;
END
$$;

-- Rebuild the key summaries of one queue from the task rows: pending counts
-- and heads. A repair tool, and what bulk loads that bypass the trigger run
-- afterwards; run it while nothing claims from the queue.
CREATE FUNCTION harvest_rebuild_summary(p_queue text) RETURNS void
LANGUAGE sql AS $$
    UPDATE fair_state SET pending = 0, head_id = NULL, head_prio = NULL, head_cont = NULL, head_due = NULL
    WHERE queue = p_queue;
    INSERT INTO fair_state AS s (queue, key, pending, head_id, head_prio, head_cont, head_due)
    SELECT DISTINCT ON (x.fairness_key) x.queue, x.fairness_key,
           count(*) OVER (PARTITION BY x.fairness_key), x.id, x.priority, x.continuation, x.due_at
    FROM tasks x
    WHERE x.queue = p_queue AND x.state = 'pending'
    ORDER BY x.fairness_key, x.priority DESC, x.continuation DESC, x.due_at, x.id
    ON CONFLICT (queue, key) DO UPDATE SET
        pending = EXCLUDED.pending, head_id = EXCLUDED.head_id, head_prio = EXCLUDED.head_prio,
        head_cont = EXCLUDED.head_cont, head_due = EXCLUDED.head_due;
$$;
