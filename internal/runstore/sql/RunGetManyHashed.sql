-- RunGetMany with each run's request hash: what a moving tenant's old home
-- holds of a group of starts' ids (runstore.Existing).
SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, output, error, request_hash
FROM runs_seen
WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY pk
