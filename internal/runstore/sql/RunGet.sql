SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, output, error, request_hash
FROM runs
WHERE tenant = $1 AND id = $2
