-- Several runs of the shard by (tenant, id), as they show (runs_seen),
-- each with its request hash: what a shard holds of a group of starts'
-- ids (runstore.Existing: a start sent again, or a moving tenant's old
-- home asked before the new one writes).
SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, output, error, request_hash
FROM runs_seen
WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY pk
