-- One claim from one queue ($7: a task id for a dispatch claim, else NULL;
-- $8: release the queue's fair lock before the WAL flush, see WalFlush).
-- The last six columns are the claimed task's run, as the worker needs it.
SELECT outcome, lag, refusals, id, run_pk, queue, fairness_key, quota_key, priority, continuation,
       due_at, sticky_worker, sticky_until, step, input, attempt, lease_token, lease_expires_at, trace_context,
       tenant, run_id, workflow, run_status, max_attempts, timeout_ms
FROM harvest_claim($1, $2, $3, $4, $5, $6::bigint * interval '1 microsecond', $7, $8)
