-- Start a group of runs in one statement: RunStart for many starts at once,
-- which spares a statement, a savepoint and a trigger round per start. The
-- caller sends each (tenant, id) once per statement. A start whose id
-- exists gets no row back; the caller reads the existing run for it.
--
-- Every array holds one element per start, in the order the starts are to
-- be written (ord, from 1). A row comes back for each new run, in no
-- particular order, with its task, whether the task is due now, whether
-- its queue had pending work before the statement, the tenant's count after
-- the statement and the shard's count before it. The caller derives from
-- those what each start would have seen had the starts run one after the
-- other (see scanStartedMany).
--
-- $1 tenants, $2 ids, $3 names, $4 queues, $5 fairness keys, $6 quota keys,
-- $7 priorities, $8 inputs (JSON text), $9 request hashes, $10 max attempts,
-- $11 timeouts ms, $12 run_at, $13 delays in microseconds, $14 trace
-- contexts (JSON text).
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::integer[],
                $8::text[], $9::bytea[], $10::integer[], $11::bigint[], $12::timestamptz[], $13::bigint[],
                $14::text[])
         WITH ORDINALITY AS i (tenant, id, name, queue, fkey, qkey, priority, input, hash,
                               max_attempts, timeout_ms, run_at, delay_us, trace, ord)
), busy AS (
    SELECT q.queue, EXISTS (SELECT 1 FROM tasks x WHERE x.queue = q.queue AND x.state = 'pending') AS queue_busy
    FROM (SELECT DISTINCT queue FROM input) AS q
), total AS (
    SELECT coalesce(sum(running), 0)::bigint AS running FROM tenant_running
), run AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                      request_hash, max_attempts, timeout_ms)
    SELECT tenant, id, name, queue, fkey, qkey, priority, input::jsonb, hash, max_attempts, timeout_ms
    FROM input
    ORDER BY ord
    ON CONFLICT (tenant, id) DO NOTHING
    RETURNING pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts, created_at
), due AS (
    SELECT run.pk, i.ord,
           coalesce(i.run_at, CASE WHEN i.delay_us > 0 THEN now() + i.delay_us * interval '1 microsecond' END,
                    now()) AS due_at
    FROM run JOIN input AS i ON i.tenant = run.tenant AND i.id = run.id
), task AS (
    -- The rows harvest_enqueue would write, without a call per row.
    INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                       step, input, trace_context)
    SELECT due.pk, i.queue, i.fkey, i.qkey, i.priority, false,
           CASE WHEN due.due_at <= now() THEN 'pending' ELSE 'scheduled' END, due.due_at,
           0, i.input::jsonb, i.trace::jsonb
    FROM due JOIN input AS i ON i.ord = due.ord
    ORDER BY due.ord
    RETURNING id, run_pk, state
), counted AS (
    INSERT INTO tenant_running AS t (tenant, running)
    SELECT tenant, count(*) FROM run GROUP BY tenant
    ON CONFLICT (tenant) DO UPDATE SET running = t.running + excluded.running
    RETURNING tenant, running
)
SELECT i.ord, run.pk, run.id, run.tenant, run.name, run.queue, run.fairness_key, run.quota_key, run.priority,
       run.status, run.attempts, run.created_at, task.id, task.state = 'pending', busy.queue_busy,
       counted.running, total.running
FROM run
JOIN input AS i ON i.tenant = run.tenant AND i.id = run.id
JOIN task ON task.run_pk = run.pk
JOIN busy ON busy.queue = run.queue
JOIN counted ON counted.tenant = run.tenant
CROSS JOIN total
