-- Write the runs and first tasks of the starts p_ords (indexes into the
-- other arrays, in the order to write them) of a start group: what
-- harvest_start_group decided to admit. A start whose (tenant, id) exists
-- by now is left out (no row back). The tasks are the rows harvest_enqueue
-- would write, without a call per row; a task due later waits as
-- 'scheduled', and its run keeps the due time in runs.not_before, which the
-- count of runs not due yet reads (runs_not_due). PL/pgSQL rather than
-- SQL, so that its plan is kept from one call to the next (a SQL function
-- with data-modifying statements is planned again on every call).
--
-- p_notify[i] says whether the run's final state is announced on NATS
-- (runs.notify); it comes last, with a default, so that a gateway of the
-- previous release, which does not pass it, still finds the function
-- during a rolling upgrade (its runs are announced, as they were).
DROP FUNCTION IF EXISTS harvest_start_write(text[], text[], text[], text[], text[], text[], integer[], text[],
                                            bytea[], integer[], bigint[], text[], timestamptz[], integer[]);
CREATE OR REPLACE FUNCTION harvest_start_write(p_tenants text[], p_ids text[], p_names text[], p_queues text[],
                                               p_keys text[], p_quota text[], p_priorities integer[],
                                               p_inputs text[], p_hashes bytea[], p_tries integer[],
                                               p_timeouts bigint[], p_traces text[], p_due timestamptz[],
                                               p_ords integer[], p_notify boolean[] DEFAULT NULL)
RETURNS TABLE (ord integer, run_pk bigint, task_id bigint)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH src AS (
        SELECT o.n AS ord, p_tenants[o.n] AS tenant, p_ids[o.n] AS id, p_names[o.n] AS name,
               p_queues[o.n] AS queue, p_keys[o.n] AS fkey, p_quota[o.n] AS qkey,
               p_priorities[o.n] AS priority, p_inputs[o.n] AS input, p_hashes[o.n] AS hash,
               p_tries[o.n] AS tries, p_timeouts[o.n] AS timeout_ms, p_traces[o.n] AS trace,
               p_due[o.n] AS due_at, coalesce(p_notify[o.n], true) AS notify
        FROM unnest(p_ords) AS o(n)
    ), run AS (
        INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                          request_hash, max_attempts, timeout_ms, not_before, notify)
        SELECT s.tenant, s.id, s.name, s.queue, s.fkey, s.qkey, s.priority, s.input::jsonb, s.hash, s.tries,
               s.timeout_ms, CASE WHEN s.due_at > now() THEN s.due_at END, s.notify
        FROM src AS s
        ORDER BY s.ord
        ON CONFLICT (tenant, id) DO NOTHING
        RETURNING runs.pk, runs.tenant, runs.id
    ), task AS (
        INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                           step, input, trace_context)
        SELECT run.pk, s.queue, s.fkey, s.qkey, s.priority, false,
               CASE WHEN s.due_at <= now() THEN 'pending' ELSE 'scheduled' END, s.due_at,
               0, s.input::jsonb, s.trace::jsonb
        FROM run JOIN src AS s ON s.tenant = run.tenant AND s.id = run.id
        ORDER BY s.ord
        RETURNING tasks.id, tasks.run_pk
    )
    SELECT s.ord, run.pk, task.id
    FROM run
    JOIN src AS s ON s.tenant = run.tenant AND s.id = run.id
    JOIN task ON task.run_pk = run.pk;
END
$$;
