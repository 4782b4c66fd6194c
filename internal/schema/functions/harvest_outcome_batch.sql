-- Record the outcomes of several leased tasks in one statement, each fenced
-- by its own lease token. Item i is p_kinds[i] of task p_ids[i] under lease
-- p_tokens[i]:
--   complete  the task is done and its run completed with p_values[i];
--   continue  the task is done and the run's next task is enqueued in the
--             continuation band (same queue and keys, step + 1) with input
--             p_values[i], due at p_due[i] (NULL: now) and, when
--             p_sticky_until[i] is set, pinned until then to the worker
--             that holds the lease;
--   fail      the attempt failed with p_errors[i]: with p_retry_at[i] set
--             and attempts left the task waits for p_retry_at[i] (pending
--             or scheduled) and the run is queued again, otherwise the task
--             is done and the run failed;
--   release   the task is handed back untouched: pending again in its old
--             place, the attempt not counted, the run queued again.
--
-- The claim does not write the run (harvest_run_claimed): each outcome but
-- a release counts the attempt that ended in the run's stored attempts and
-- keeps the task's claim time as the run's first when it has none, so that
-- the run stores what runs_seen showed while the attempt ran. A
-- continuation stores the run 'running' (it reads running between its
-- steps); a retry and a release store it 'queued'. A release of a run
-- stored 'queued' (its first step) changes nothing of the run, so it is
-- not written.
--
-- p_now decides whether a due time has come (NULL: the database clock).
--
-- This is the one definition of what each outcome does: harvest_complete,
-- harvest_continue, harvest_fail and harvest_complete_batch record theirs
-- through it (harvest_outcome_one).
--
-- Answers come in the order of p_ids: outcome 'ok', 'stale' (the token is
-- not the task's current one, or the task is not running: nothing of it was
-- changed) or 'not_found'; for a failure whether it will run again; for a
-- continuation the new task's id; and, when this statement made the run
-- final and the run is announced (runs.notify), the run as the run event
-- shows it (a run nobody asked to hear of is not read again). A task named twice is recorded
-- once, by its first item; the others are 'stale'.
--
-- Locks are taken in one order, the order of the rescue of expired leases:
-- the tasks by id, then the runs (by the update), then the tenants' count
-- rows of the runs made final in byte order (COLLATE "C") and the shard
-- count stripes they fall into (harvest_running_lock); the continuations
-- are enqueued last, in (queue, key) order, as a start group writes its
-- keys.
CREATE OR REPLACE FUNCTION harvest_outcome_batch(p_kinds text[], p_ids bigint[], p_tokens uuid[], p_values jsonb[],
                                                 p_errors text[], p_retry_at timestamptz[], p_due timestamptz[],
                                                 p_sticky_until timestamptz[], p_now timestamptz)
RETURNS TABLE (task_id bigint, outcome text, retried boolean, next_id bigint,
               run_id text, run_tenant text, run_name text, run_queue text, run_fairness_key text,
               run_quota_key text, run_priority integer, run_status text, run_attempts integer,
               run_created_at timestamptz, run_claimed_at timestamptz, run_finished_at timestamptz,
               run_output jsonb, run_error text)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
-- Generic plans, as in the bulk claim: every statement below (and in what
-- it calls) finds its rows by id or key, so one plan serves every batch
-- size. Left to choose, the plan cache planned the statements again for
-- each small batch (a custom plan for a few ids looked cheaper than the
-- generic one), which took half of a one-outcome batch's database time
-- (docs/benchmarks.md, "The outcome batch's plans"). A generic plan is
-- made once per connection, with the sizes of that moment: on a fresh
-- shard, with a task or two, a scan of the whole table looked cheapest
-- and stayed the plan as the shard grew (40 ms a batch at 100,000 tasks,
-- until an ANALYZE). No sequential scans, so that each lookup takes its
-- index whatever the table's size when the plan was made.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_n       integer := coalesce(cardinality(p_ids), 0);
    v_now     timestamptz := coalesce(p_now, now());
    v_live    integer[];  -- items whose lease is current
    v_retry   integer[];  -- failures that will run again
    v_cont    integer[];  -- continuations
    v_fin     integer[];  -- items whose run this statement made final, if announced
    v_fin_pk  bigint[];   -- their runs
    v_tenants text[];     -- and their tenants
    v_next    bigint[];   -- by item: the continuation's task id
    r_cnt     record;
    r_cont    record;
BEGIN
    IF v_n <> coalesce(cardinality(p_kinds), 0) OR v_n <> coalesce(cardinality(p_tokens), 0)
       OR v_n <> coalesce(cardinality(p_values), 0) OR v_n <> coalesce(cardinality(p_errors), 0)
       OR v_n <> coalesce(cardinality(p_retry_at), 0) OR v_n <> coalesce(cardinality(p_due), 0)
       OR v_n <> coalesce(cardinality(p_sticky_until), 0) THEN
        RAISE EXCEPTION 'harvest_outcome_batch: % ids, % kinds, % tokens, % values, % errors, % retry times, % due times, % sticky ends',
            v_n, cardinality(p_kinds), cardinality(p_tokens), cardinality(p_values), cardinality(p_errors),
            cardinality(p_retry_at), cardinality(p_due), cardinality(p_sticky_until);
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) AS k(kind)
               WHERE k.kind IS NULL OR k.kind NOT IN ('complete', 'continue', 'fail', 'release')) THEN
        RAISE EXCEPTION 'harvest_outcome_batch: unknown outcome kind in %', p_kinds;
    END IF;
    v_next := array_fill(NULL::bigint, ARRAY[v_n]);

    PERFORM 1 FROM tasks t WHERE t.id = ANY (p_ids) ORDER BY t.id FOR UPDATE;
    -- One statement writes the tasks and their runs: each item's plan is
    -- read from the rows as locked above.
    WITH inp AS (
        SELECT i.id, i.token, i.ord::integer AS ord, p_kinds[i.ord] AS kind
        FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS i(id, token, ord)
    ), live AS (
        SELECT DISTINCT ON (inp.id) inp.id, inp.ord, inp.kind, t.run_pk, t.claimed_at,
               -- A failure runs again when a retry time is given and the run
               -- has attempts left (a run without max_attempts has one).
               (inp.kind = 'fail' AND p_retry_at[inp.ord] IS NOT NULL
                AND t.attempt < coalesce(r.max_attempts, 1)) AS retry
        FROM inp
        -- One probe of a task's key per item. As a plain join, planned
        -- generic, the tasks were read by the batch's ids and the items
        -- scanned again for each task found (48 outcomes: 2,304 pairs
        -- compared; 256: 65,536); OFFSET 0 keeps the subquery a probe,
        -- never a read of every running task (tasks_running), whatever
        -- the statistics say.
        CROSS JOIN LATERAL (SELECT x.run_pk, x.claimed_at, x.attempt FROM tasks x
                            WHERE x.id = inp.id AND x.state = 'running' AND x.lease_token = inp.token
                            OFFSET 0) t
        -- Only a failure reads its run (for its attempts), one probe each.
        LEFT JOIN LATERAL (SELECT x.max_attempts FROM runs x
                           WHERE inp.kind = 'fail' AND x.pk = t.run_pk OFFSET 0) r ON true
        ORDER BY inp.id, inp.ord
    ), plan AS (
        SELECT live.id, live.ord, live.kind, live.run_pk, live.claimed_at, live.retry,
               -- The run ends here: a completion, or a failure not retried.
               (live.kind = 'complete' OR (live.kind = 'fail' AND NOT live.retry)) AS final,
               -- The task goes back to wait: a release, or a retry.
               (live.kind = 'release' OR live.retry) AS back
        FROM live
    ), task_upd AS (
        UPDATE tasks t SET
            state            = CASE WHEN NOT p.back THEN 'done'
                                    WHEN p.kind = 'release' OR p_retry_at[p.ord] <= v_now THEN 'pending'
                                    ELSE 'scheduled' END,
            due_at           = CASE WHEN p.retry THEN p_retry_at[p.ord] ELSE t.due_at END,
            attempt          = CASE WHEN p.kind = 'release' THEN greatest(t.attempt - 1, 0) ELSE t.attempt END,
            lease_token      = CASE WHEN p.back THEN NULL ELSE t.lease_token END,
            lease_expires_at = NULL,
            claimed_by       = CASE WHEN p.back THEN NULL ELSE t.claimed_by END
        FROM plan p
        WHERE t.id = p.id
    ), run_upd AS (
        -- A final run is left alone (a cancel got there first: it counted
        -- the attempt it took out). Any other run is stored 'queued' or
        -- 'running', and both are taken: 'queued' is what a run reads
        -- whose attempt is in flight, 'running' one that continued, and
        -- also a run a claim of the previous release marked running during
        -- a rolling upgrade (migration 0014 took the attempt that claim
        -- counted back out, so it is counted here once).
        UPDATE runs r SET
            status      = CASE WHEN p.kind = 'complete' THEN 'completed' WHEN p.final THEN 'failed'
                               WHEN p.kind = 'continue' THEN 'running' ELSE 'queued' END,
            output      = CASE WHEN p.kind = 'complete' THEN p_values[p.ord] WHEN p.final THEN NULL ELSE r.output END,
            error       = CASE WHEN p.kind = 'complete' THEN NULL WHEN p.kind = 'fail' THEN p_errors[p.ord] ELSE r.error END,
            finished_at = CASE WHEN p.final THEN now() ELSE r.finished_at END,
            attempts    = CASE WHEN p.kind = 'release' THEN r.attempts ELSE r.attempts + 1 END,
            claimed_at  = CASE WHEN p.kind = 'release' THEN r.claimed_at ELSE coalesce(r.claimed_at, p.claimed_at) END
        FROM plan p
        WHERE r.pk = p.run_pk AND r.status NOT IN ('completed', 'failed', 'cancelled')
          AND NOT (p.kind = 'release' AND r.status = 'queued')
        RETURNING p.ord, p.final, r.pk, r.tenant, r.notify
    )
    SELECT (SELECT array_agg(p.ord ORDER BY p.id) FROM plan p),
           (SELECT array_agg(p.ord ORDER BY p.id) FROM plan p WHERE p.retry),
           (SELECT array_agg(p.ord ORDER BY p.id) FROM plan p WHERE p.kind = 'continue'),
           (SELECT array_agg(u.ord ORDER BY u.ord) FROM run_upd u WHERE u.final AND u.notify),
           (SELECT array_agg(u.pk ORDER BY u.ord) FROM run_upd u WHERE u.final AND u.notify),
           (SELECT array_agg(u.tenant ORDER BY u.ord) FROM run_upd u WHERE u.final)
    INTO v_live, v_retry, v_cont, v_fin, v_fin_pk, v_tenants;

    -- The finished runs free their tenants' slots, tenants in byte order.
    -- (Their rows and the shard's count stripes first: harvest_running_lock.)
    -- Runs of a single tenant, the usual batch, need no locks taken ahead:
    -- its one update takes that tenant's row and then, by its trigger, the
    -- one stripe its fall goes to, which is already the lock order.
    IF NOT (v_tenants[1] = ALL (v_tenants)) THEN
        PERFORM harvest_running_lock(v_tenants);
    END IF;
    FOR r_cnt IN SELECT t.tenant, count(*)::integer AS n FROM unnest(v_tenants) AS t(tenant)
                 GROUP BY t.tenant ORDER BY t.tenant COLLATE "C" LOOP
        UPDATE tenant_running SET running = greatest(running - r_cnt.n, 0)
        WHERE tenant = r_cnt.tenant AND running > 0;
    END LOOP;

    -- The continuations, through the one insert path of tasks.
    FOR r_cont IN
        SELECT c.ord, t.run_pk, t.queue, t.fairness_key, t.quota_key, t.priority, t.claimed_by, t.step,
               t.trace_context
        FROM unnest(v_cont) AS c(ord) JOIN tasks t ON t.id = p_ids[c.ord]
        ORDER BY t.queue COLLATE "C", t.fairness_key COLLATE "C", t.id
    LOOP
        v_next[r_cont.ord] := harvest_enqueue(r_cont.run_pk, r_cont.queue, r_cont.fairness_key, r_cont.quota_key,
            r_cont.priority, true, p_due[r_cont.ord],
            CASE WHEN p_sticky_until[r_cont.ord] IS NULL THEN NULL ELSE r_cont.claimed_by END,
            p_sticky_until[r_cont.ord], r_cont.step + 1, p_values[r_cont.ord], r_cont.trace_context, p_now);
    END LOOP;

    RETURN QUERY
        SELECT i.id,
               CASE WHEN l.ord IS NOT NULL THEN 'ok'
                    WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.id) THEN 'stale'
                    ELSE 'not_found' END,
               rt.ord IS NOT NULL,
               v_next[i.ord],
               r.id, r.tenant, r.name, r.queue, r.fairness_key, r.quota_key, r.priority, r.status, r.attempts,
               r.created_at, r.claimed_at, r.finished_at, r.output, r.error
        FROM unnest(p_ids) WITH ORDINALITY AS i(id, ord)
        LEFT JOIN unnest(v_live) AS l(ord) ON l.ord = i.ord
        LEFT JOIN unnest(v_retry) AS rt(ord) ON rt.ord = i.ord
        LEFT JOIN unnest(v_fin, v_fin_pk) AS f(ord, pk) ON f.ord = i.ord
        LEFT JOIN runs r ON r.pk = f.pk
        ORDER BY i.ord;
END
$$;
