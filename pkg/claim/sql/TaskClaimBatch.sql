-- Up to $7 claims from one queue in one statement ($8: see TaskClaim; $9: single
-- steps before the first bulk step, see harvest_claim_batch).
SELECT outcome, lag, refusals, id, run_pk, queue, fairness_key, quota_key, priority, continuation,
       due_at, sticky_worker, sticky_until, step, input, attempt, lease_token, lease_expires_at, trace_context,
       tenant, run_id, workflow, run_status, max_attempts, timeout_ms
FROM harvest_claim_batch($1, $2, $3, $4, $5, $6::bigint * interval '1 microsecond', $7, $8, $9)
