-- Cancel run $2 of tenant $1 with error $3 (harvest_run_cancel says what
-- each outcome means); no row when there is no such run.
SELECT outcome, was_running, pk, id, tenant, name, queue, fairness_key, quota_key, priority, status,
       attempts, created_at, claimed_at, finished_at, output, error, request_hash, notify
FROM harvest_run_cancel($1, $2, $3)
