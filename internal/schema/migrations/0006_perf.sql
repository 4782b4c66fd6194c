-- Batched claim and completion for throughput past the one-commit-per-task
-- limit.
--
-- harvest_claim_batch (0002) ran the single claim n times. That is exact but
-- pays every step of the claim (key probes, lease update, run update, charge,
-- head refresh) once per row. In the common shape of a backlog (one key has
-- all the due work of the queue, or the ordinary claim takes the first rows
-- of its index) most of those steps can be done once for a run of rows that
-- the single claim would have taken one after the other. The new batch takes
-- such runs in bulk and falls back to the single claim for every other step,
-- so the rows come back in the same order, with the same lags and the same
-- fairness state as n single claims would give.
--
-- harvest_complete_batch finishes several leased tasks in one statement,
-- each fenced by its own lease token.

-- The summary trigger also stays out of a bulk lease: the batch holds the
-- summary rows of the keys it leases from and refreshes them itself.
CREATE OR REPLACE FUNCTION harvest_tasks_summary() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (current_setting('harvest.summary_owned', true) = OLD.id::text
                             OR current_setting('harvest.summary_bulk', true) = 'on') THEN
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

-- Lease the given pending rows (already locked by the caller) in one update
-- with the summary trigger kept out, mark their runs running, and return
-- them in the order of p_ids.
CREATE FUNCTION harvest_lease_bulk(p_ids bigint[], p_worker text, p_lease interval)
RETURNS SETOF tasks
LANGUAGE plpgsql AS $$
DECLARE
    v_rows tasks[];
    v_runs bigint[];
BEGIN
    PERFORM set_config('harvest.summary_bulk', 'on', true);
    WITH u AS (
        UPDATE tasks SET
            state            = 'running',
            attempt          = attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = clock_timestamp()
        WHERE id = ANY (p_ids) AND state = 'pending'
        RETURNING *
    )
    SELECT array_agg(u::tasks ORDER BY array_position(p_ids, u.id)), array_agg(u.run_pk ORDER BY u.run_pk)
    INTO v_rows, v_runs FROM u;
    PERFORM set_config('harvest.summary_bulk', '', true);
    UPDATE runs SET
        status     = 'running',
        attempts   = attempts + 1,
        claimed_at = coalesce(claimed_at, now())
    WHERE pk = ANY (v_runs) AND status IN ('queued', 'running');
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;

-- The first pending row of a key, read from the key's index starting at a
-- known earlier head (p_*): every row before the head of a key is claimed,
-- so the search seeks past the index entries of rows claimed since the
-- last vacuum instead of stepping over them one by one (they are what made
-- a drain slow down as it went). When the head's group (priority,
-- continuation) has no pending row left, or no head is known, the whole key
-- is searched in order.
CREATE FUNCTION harvest_key_head(p_queue text, p_key text, p_prio integer, p_cont boolean,
                                 p_due timestamptz, p_id bigint,
                                 OUT head_id bigint, OUT head_prio integer, OUT head_cont boolean,
                                 OUT head_due timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_id IS NOT NULL THEN
        SELECT x.id, x.priority, x.continuation, x.due_at INTO head_id, head_prio, head_cont, head_due
        FROM tasks x
        WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
          AND x.priority = p_prio AND x.continuation = p_cont AND (x.due_at, x.id) >= (p_due, p_id)
        ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
        LIMIT 1;
        IF head_id IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    SELECT x.id, x.priority, x.continuation, x.due_at INTO head_id, head_prio, head_cont, head_due
    FROM tasks x
    WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
    ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
    LIMIT 1;
END
$$;

-- A key's summary after rows left it (a bulk step took p_n of them): lock
-- the summary row, then find the new head from the old one.
CREATE FUNCTION harvest_key_refresh_bulk(p_queue text, p_key text, p_n integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r_f    fair_state%ROWTYPE;
    r_head record;
BEGIN
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, r_f.head_prio, r_f.head_cont, r_f.head_due, r_f.head_id);
    UPDATE fair_state SET
        pending   = CASE WHEN r_head.head_id IS NULL THEN 0 ELSE greatest(pending - p_n, 1) END,
        head_id   = r_head.head_id,
        head_prio = r_head.head_prio,
        head_cont = r_head.head_cont,
        head_due  = r_head.head_due
    WHERE queue = p_queue AND key = p_key;
END
$$;

-- One bulk step of a batch: up to p_n rows that n single claims would take
-- one after the other, or none when this step needs the single claim.
--   Fair: only when exactly one key of the queue has due pending work. That
--   key would win every single claim of the step, so its rows are taken in
--   its index order, skipping rows other claimers hold (so concurrent
--   batches of the key do not wait for each other), and then, under the
--   lock of the key's state row, the key is charged once per row (the same
--   float arithmetic as the single charge, in a loop) with one write of its
--   summary row. The lag of each row is the one the single claim reports.
--   Ordinary: the first unlocked rows of the seek index; the summaries of
--   their keys are refreshed once per key.
--   Both stop before the first row with a quota key (the rechecks are the
--   single claim's business), and need no ageing and no rows pinned to the
--   worker (the caller checks both).
CREATE FUNCTION harvest_claim_bulk(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                   p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_due_cut  timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_keys     text[];
    v_head_due timestamptz;
    v_hp       integer;
    v_hc       boolean;
    v_hid      bigint;
    v_key      text;
    v_ids      bigint[];
    v_quota    text[];
    v_fkeys    text[];
    v_rows     tasks[];
    v_cut      integer;
    v_k        integer;
    v_w        double precision := 1;
    v_clock    double precision;
    v_clock0   double precision;
    v_pass     double precision;
    v_start    double precision;
    v_lags     double precision[] := '{}';
    v_debt     boolean;
    v_i        integer;
    r_f        fair_state%ROWTYPE;
    r_task     tasks%ROWTYPE;
    r_head     record;
    r_cnt      record;
BEGIN
    IF p_fair THEN
        SELECT array_agg(key), max(head_due), min(head_prio), bool_or(head_cont), min(head_id)
        INTO v_keys, v_head_due, v_hp, v_hc, v_hid FROM (
            SELECT key, head_due, head_prio, head_cont, head_id FROM fair_state
            WHERE queue = p_queue AND head_id IS NOT NULL LIMIT 2) s;
        IF cardinality(v_keys) IS DISTINCT FROM 1 OR v_head_due > v_due_cut THEN
            RETURN;
        END IF;
        v_key := v_keys[1];
        -- Seek from the key's head inside its (priority, continuation)
        -- group (see harvest_key_head); the next step moves to the next
        -- group. Without rows there (a stale head), the whole key in order.
        SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o) INTO v_ids, v_quota FROM (
            SELECT x.id, x.quota_key, row_number() OVER () AS o FROM (
                SELECT y.id, y.quota_key FROM tasks y
                WHERE y.queue = p_queue AND y.fairness_key = v_key AND y.state = 'pending'
                  AND y.priority = v_hp AND y.continuation = v_hc AND (y.due_at, y.id) >= (v_head_due, v_hid)
                  AND y.due_at <= v_due_cut
                ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
        IF v_ids IS NULL THEN
            SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o) INTO v_ids, v_quota FROM (
                SELECT x.id, x.quota_key, row_number() OVER () AS o FROM (
                    SELECT y.id, y.quota_key FROM tasks y
                    WHERE y.queue = p_queue AND y.fairness_key = v_key AND y.state = 'pending'
                      AND y.due_at <= v_due_cut
                    ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                    LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
        END IF;
    ELSE
        -- The queue's first pending row is the best of the keys' heads:
        -- seek from it inside its group, as above.
        SELECT head_prio, head_cont, head_due, head_id INTO v_hp, v_hc, v_head_due, v_hid
        FROM fair_state WHERE queue = p_queue AND head_id IS NOT NULL
        ORDER BY head_prio DESC, head_cont DESC, head_due, head_id
        LIMIT 1;
        IF v_hid IS NOT NULL THEN
            SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o), array_agg(fairness_key ORDER BY o)
            INTO v_ids, v_quota, v_fkeys FROM (
                SELECT x.id, x.quota_key, x.fairness_key, row_number() OVER () AS o FROM (
                    SELECT y.id, y.quota_key, y.fairness_key FROM tasks y
                    WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                      AND y.priority = v_hp AND y.continuation = v_hc AND (y.due_at, y.id) >= (v_head_due, v_hid)
                    ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                    LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
        END IF;
        IF v_ids IS NULL THEN
            SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o), array_agg(fairness_key ORDER BY o)
            INTO v_ids, v_quota, v_fkeys FROM (
                SELECT x.id, x.quota_key, x.fairness_key, row_number() OVER () AS o FROM (
                    SELECT y.id, y.quota_key, y.fairness_key FROM tasks y
                    WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                    ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                    LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
        END IF;
    END IF;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    v_cut := 0;
    FOR v_i IN 1..cardinality(v_quota) LOOP
        IF v_quota[v_i] <> '' THEN
            v_cut := v_i;
            EXIT;
        END IF;
    END LOOP;
    IF v_cut > 0 THEN
        v_ids := v_ids[1:v_cut - 1];
        v_fkeys := v_fkeys[1:v_cut - 1];
    END IF;
    v_k := coalesce(cardinality(v_ids), 0);
    IF v_k = 0 THEN
        RETURN;
    END IF;

    SELECT array_agg(l ORDER BY array_position(v_ids, l.id)) INTO v_rows
    FROM harvest_lease_bulk(v_ids, p_worker, p_lease) AS l;

    IF p_fair THEN
        -- The charges of k single claims of this key, in order, under the
        -- lock of its state row (concurrent charges of the key queue here).
        SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = v_key FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO fair_state (queue, key) VALUES (p_queue, v_key) ON CONFLICT DO NOTHING;
            SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = v_key FOR UPDATE;
        END IF;
        IF v_key <> '' THEN
            SELECT weight INTO v_w FROM weight_overrides WHERE queue = p_queue AND key = v_key;
            v_w := coalesce(v_w, 1);
        END IF;
        v_clock0 := harvest_clock(p_queue);
        v_clock := v_clock0;
        v_pass := r_f.pass;
        v_debt := r_f.in_debt;
        FOR v_i IN 1..v_k LOOP
            -- The single claim reports lag 0 for a key without the debt
            -- mark, else its pass over the clock.
            v_lags := v_lags || CASE WHEN NOT v_debt THEN 0::double precision
                                     ELSE greatest(v_pass, v_clock) - v_clock END;
            v_start := CASE WHEN v_pass IS NULL THEN v_clock ELSE greatest(v_pass, v_clock) END;
            v_pass := v_start + 1::double precision / v_w;
            v_clock := greatest(v_clock, v_start);
            v_debt := true;
        END LOOP;
        -- One write of the key's state and summary: the charges, the count
        -- and the new head.
        SELECT * INTO r_head FROM harvest_key_head(p_queue, v_key, r_f.head_prio, r_f.head_cont,
                                                   r_f.head_due, r_f.head_id);
        UPDATE fair_state SET
            last_start = v_start,
            pass       = v_pass,
            charged_at = v_now,
            in_debt    = true,
            pending    = CASE WHEN r_head.head_id IS NULL THEN 0 ELSE greatest(pending - v_k, 1) END,
            head_id    = r_head.head_id,
            head_prio  = r_head.head_prio,
            head_cont  = r_head.head_cont,
            head_due   = r_head.head_due
        WHERE queue = p_queue AND key = v_key;
        -- Clear the debt mark of the keys the new clock caught up with.
        -- Only passes above the old clock can be newly caught up: every
        -- charge clears the marks at or below its start, so older passes
        -- carry no mark unless another claimer held their row at the time
        -- (a stale mark costs order under concurrency, never a task; the
        -- single charge still sweeps them). Bounding the range from below
        -- keeps this probe off the dead index entries that the old
        -- versions of the charged key's row leave behind until a vacuum.
        IF v_start > v_clock0 THEN
            UPDATE fair_state f SET in_debt = false
            FROM (SELECT d.queue, d.key FROM fair_state d
                  WHERE d.queue = p_queue AND d.in_debt AND d.pass > v_clock0 AND d.pass <= v_start
                  FOR UPDATE SKIP LOCKED) c
            WHERE f.queue = c.queue AND f.key = c.key;
        END IF;
    ELSE
        -- The summaries of the keys the rows came from, in key order (the
        -- lock order of every bulk step), each refreshed once.
        FOR r_cnt IN SELECT k, count(*)::integer AS n FROM unnest(v_fkeys) k GROUP BY k ORDER BY k COLLATE "C" LOOP
            PERFORM harvest_key_refresh_bulk(p_queue, r_cnt.k, r_cnt.n);
        END LOOP;
    END IF;

    FOR v_i IN 1..coalesce(cardinality(v_rows), 0) LOOP
        r_task := v_rows[v_i];
        RETURN NEXT ROW('ok', CASE WHEN p_fair THEN v_lags[array_position(v_ids, r_task.id)] ELSE 0 END,
                        '[]'::jsonb, r_task.id, r_task.run_pk, r_task.queue, r_task.fairness_key,
                        r_task.quota_key, r_task.priority, r_task.continuation, r_task.due_at,
                        r_task.sticky_worker, r_task.sticky_until, r_task.step, r_task.input,
                        r_task.attempt, r_task.lease_token, r_task.lease_expires_at, r_task.trace_context)::harvest_claimed;
    END LOOP;
END
$$;

-- Up to p_n claims in one statement, each in the order the single claim
-- would take it; a fair batch charges the key of every row taken. Bulk
-- steps (above) take runs of rows at once where that gives the same result;
-- every other step is the single claim. When the batch stops early with
-- refusals, a last row with outcome 'refused' carries them.
CREATE OR REPLACE FUNCTION harvest_claim_batch(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                               p_aging integer, p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    r_out  harvest_claimed;
    v_left integer := p_n;
    v_got  integer;
    v_bulk boolean;
    v_i    integer := 0;
BEGIN
    v_bulk := p_aging = 0
        AND NOT (p_worker <> '' AND EXISTS (
            SELECT 1 FROM tasks x
            WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
              AND x.sticky_until > coalesce(p_now, now())));
    IF v_bulk THEN
        PERFORM harvest_promote_due(p_queue, coalesce(p_now, now()), 1000);
    END IF;
    WHILE v_left > 0 LOOP
        v_i := v_i + 1;
        IF v_bulk THEN
            v_got := 0;
            FOR r_out IN SELECT * FROM harvest_claim_bulk(p_queue, p_worker, p_now, p_fair, p_lease, v_left) LOOP
                v_got := v_got + 1;
                RETURN NEXT r_out;
            END LOOP;
            v_left := v_left - v_got;
            CONTINUE WHEN v_got > 0;
        END IF;
        r_out := harvest_claim(p_queue, p_worker, p_now, p_fair, p_aging, p_lease, NULL, v_i = 1 AND NOT v_bulk);
        IF r_out.outcome <> 'ok' THEN
            IF r_out.outcome = 'refused' THEN
                RETURN NEXT r_out;
            END IF;
            RETURN;
        END IF;
        RETURN NEXT r_out;
        v_left := v_left - 1;
    END LOOP;
END
$$;

-- Finish several leased tasks and their runs, each fenced by its lease
-- token: a task whose token is not current (or that is not running) is left
-- alone and reported 'stale', an unknown id 'not_found'; the others are
-- 'ok'. Answers come in the order of p_ids. Rows are locked in id order and tenants' counts are updated in
-- tenant order, so concurrent batches cannot deadlock on each other.
CREATE FUNCTION harvest_complete_batch(p_ids bigint[], p_tokens uuid[], p_outputs jsonb[])
RETURNS TABLE (task_id bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    v_done    bigint[];
    v_done_tok uuid[];
    v_tenants text[];
    r_cnt     record;
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens)
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_outputs) THEN
        RAISE EXCEPTION 'harvest_complete_batch: % ids, % tokens, % outputs',
            cardinality(p_ids), cardinality(p_tokens), cardinality(p_outputs);
    END IF;
    PERFORM 1 FROM tasks t WHERE t.id = ANY (p_ids) ORDER BY t.id FOR UPDATE;
    WITH inp AS (
        SELECT i.id, i.token, i.output FROM unnest(p_ids, p_tokens, p_outputs) AS i(id, token, output)
    ), ok AS (
        UPDATE tasks t SET state = 'done', lease_expires_at = NULL
        FROM inp
        WHERE t.id = inp.id AND t.state = 'running' AND t.lease_token = inp.token
        RETURNING t.id, t.lease_token, t.run_pk, inp.output
    ), fin AS (
        UPDATE runs r SET status = 'completed', output = ok.output, error = NULL, finished_at = now()
        FROM ok
        WHERE r.pk = ok.run_pk AND r.status NOT IN ('completed', 'failed', 'cancelled')
        RETURNING r.tenant
    )
    SELECT (SELECT array_agg(ok.id) FROM ok), (SELECT array_agg(ok.lease_token) FROM ok),
           (SELECT array_agg(fin.tenant) FROM fin)
    INTO v_done, v_done_tok, v_tenants;
    FOR r_cnt IN SELECT t.tenant, count(*)::integer AS n FROM unnest(v_tenants) AS t(tenant)
                 GROUP BY t.tenant ORDER BY t.tenant COLLATE "C" LOOP
        UPDATE tenant_running SET running = greatest(running - r_cnt.n, 0)
        WHERE tenant = r_cnt.tenant AND running > 0;
    END LOOP;
    RETURN QUERY
        SELECT i.id,
               CASE WHEN EXISTS (SELECT 1 FROM unnest(v_done, v_done_tok) AS d(id, tok)
                                 WHERE d.id = i.id AND d.tok = p_tokens[i.ord]) THEN 'ok'
                    WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.id) THEN 'stale'
                    ELSE 'not_found' END
        FROM unnest(p_ids) WITH ORDINALITY AS i(id, ord)
        ORDER BY i.ord;
END
$$;
