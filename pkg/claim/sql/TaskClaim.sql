-- One claim from one queue ($7: a task id for a dispatch claim, else NULL;
-- $8: release the queue's fair lock before the WAL flush, see WalFlush).
SELECT outcome, lag, refusals, id, run_pk, queue, fairness_key, quota_key, priority, continuation,
       due_at, sticky_worker, sticky_until, step, input, attempt, lease_token, lease_expires_at, trace_context
FROM harvest_claim($1, $2, $3, $4, $5, $6::bigint * interval '1 microsecond', $7, $8)
