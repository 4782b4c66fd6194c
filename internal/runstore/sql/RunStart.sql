-- Start a run in one statement: insert the run unless (tenant, id) exists,
-- enqueue its first task through harvest_enqueue (the schema's only task
-- insert path, which records its arrival for the fair claim) and count the run for
-- its tenant. No row comes back when the id already exists: the caller then
-- reads the existing run to tell a replay from a conflict.
--
-- ON CONFLICT DO NOTHING waits for a concurrent insert of the same id to
-- commit, so two gateways racing on one id make exactly one run.
--
-- queue_busy is read with this statement's snapshot, before the new task:
-- it says whether the queue already had pending work (so a dispatch of the
-- new task would only jump the queue).
--
-- shard_running is the shard's count over all tenants including the new
-- run: the count (harvest_shard_running) is read with the statement's
-- snapshot, before its own increment, hence the + 1.
--
-- $1 tenant, $2 id, $3 name, $4 queue, $5 fairness key, $6 quota key,
-- $7 priority, $8 input, $9 request hash, $10 max attempts, $11 timeout ms,
-- $12 run_at, $13 delay in microseconds, $14 trace context, $15 whether
-- it is a fired deferred start, $16 whether the run's final state is
-- announced on NATS (runs.notify).
--
-- scheduled is the tenant's runs not due yet after the start, this one
-- included, when this run is not due yet (runs.not_before); 0 otherwise.
--
-- The run's columns are named as every read of runs names them
-- (runstore.RunRow), the new run's unset ones included.
WITH due AS (
    SELECT coalesce($12::timestamptz,
                    CASE WHEN $13::bigint > 0 THEN now() + $13::bigint * interval '1 microsecond' END) AS at
), run AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                      request_hash, max_attempts, timeout_ms, not_before, notify)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, CASE WHEN due.at > now() THEN due.at END,
           $16::boolean
    FROM due
    -- HA020 when the tenant has moved away (tenant_fences), unless this is
    -- the run of a deferred start firing ($15), whose id the shard holds.
    WHERE $15::boolean OR harvest_tenant_fence(ARRAY[$1::text])
    ON CONFLICT (tenant, id) DO NOTHING
    RETURNING pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts, created_at,
              claimed_at, finished_at, output, error
), busy AS (
    SELECT harvest_queue_pending($4) AS queue_busy
), task AS (
    SELECT harvest_enqueue(run.pk, $4, $5, $6, $7, false, due.at,
                           NULL, NULL, 0, $8::jsonb, $14::jsonb, NULL) AS id
    FROM run, due
), counted AS (
    INSERT INTO tenant_running AS t (tenant, running)
    SELECT $1, 1 FROM run
    ON CONFLICT (tenant) DO UPDATE SET running = t.running + 1
    -- A tenant moving here is judged with its runs still on the old home.
    RETURNING running + coalesce((SELECT a.runs FROM tenant_away a WHERE a.tenant = $1), 0) AS running
)
SELECT run.pk, run.id, run.tenant, run.name, run.queue, run.fairness_key, run.quota_key, run.priority,
       run.status, run.attempts, run.created_at, run.claimed_at, run.finished_at, run.output, run.error,
       task.id AS task_id, busy.queue_busy, counted.running,
       harvest_shard_running() + 1 AS shard_running,
       harvest_shard_lease() AS shard_lease,
       CASE WHEN due.at > now()
            THEN (SELECT count(*) FROM runs h
                  WHERE h.tenant = $1 AND h.not_before > now() AND h.finished_at IS NULL) + 1
            ELSE 0 END AS scheduled
FROM run, task, busy, counted, due
