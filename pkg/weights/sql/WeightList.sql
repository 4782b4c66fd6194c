-- The overrides of queue $1, by key in byte order.
SELECT key, weight, updated_at, updated_by FROM weight_overrides
WHERE queue = $1
ORDER BY key COLLATE "C"
