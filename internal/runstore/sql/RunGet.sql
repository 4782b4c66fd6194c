-- The run $2 of tenant $1 as it shows (runs_seen: status, attempts and
-- claimed_at count the attempt in flight), with its request hash.
SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, output, error, request_hash
FROM runs_seen
WHERE tenant = $1 AND id = $2
