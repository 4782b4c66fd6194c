-- Put final run $1 (failed or cancelled, locked by RunRetryLock) back in
-- its queue, by hand: the run is queued again with its attempts kept, its
-- output and error cleared; a new task repeats the run's last task (same
-- step, input and keys) with a fresh attempt budget, enqueued through
-- harvest_enqueue so the fair claim sees it arrive; the tenant's count
-- grows by one, judged by the caller's admitter with the counts returned
-- (as a start's are); and the audit row is written, actor $2. $3 is the
-- trace context of the retry (NULL: keep the start's).
WITH last AS (
    SELECT t.queue, t.fairness_key, t.quota_key, t.priority, t.continuation, t.step, t.input, t.trace_context
    FROM tasks t WHERE t.run_pk = $1 ORDER BY t.id DESC LIMIT 1
), run AS (
    UPDATE runs r SET status = 'queued', finished_at = NULL, output = NULL, error = NULL
    WHERE r.pk = $1 AND r.status IN ('failed', 'cancelled')
    RETURNING r.pk, r.tenant, r.id, r.queue, r.fairness_key, r.name, r.attempts
), task AS (
    SELECT harvest_enqueue(run.pk, last.queue, last.fairness_key, last.quota_key, last.priority,
                           last.continuation, NULL, NULL, NULL, last.step, last.input,
                           coalesce($3::jsonb, last.trace_context), NULL) AS id
    FROM run, last
), counted AS (
    UPDATE tenant_running t SET running = t.running + 1
    FROM run WHERE t.tenant = run.tenant
    -- A tenant moving here is judged with its runs still on the old home.
    RETURNING t.running + coalesce((SELECT a.runs FROM tenant_away a WHERE a.tenant = t.tenant), 0) AS running
), audited AS (
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    SELECT $2, 'run.retry', run.queue, run.fairness_key,
           jsonb_build_object('tenant', run.tenant, 'id', run.id, 'status', $4::text),
           jsonb_build_object('tenant', run.tenant, 'id', run.id, 'status', 'queued', 'attempts', run.attempts),
           'ok', ''
    FROM run
)
SELECT task.id AS task_id,
       counted.running,
       -- The shard's count before this statement's own increment, plus it.
       harvest_shard_running() + 1 AS shard_running,
       harvest_shard_lease() AS shard_lease
FROM run, task, counted
