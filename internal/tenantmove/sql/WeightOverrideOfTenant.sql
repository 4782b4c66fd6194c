-- The weight overrides of the tenant's keys ($1, sub-key pattern $2).
SELECT queue, key, weight, updated_at, updated_by
FROM weight_overrides
WHERE key = $1 OR key LIKE $2 ESCAPE '\'
ORDER BY queue, key
