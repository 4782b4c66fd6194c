-- Several runs of the shard by (tenant, id) (the worker's run events), as
-- they show (runs_seen).
SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, output, error
FROM runs_seen
WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY pk
