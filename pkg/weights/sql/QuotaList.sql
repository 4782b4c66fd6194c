-- The quotas of queue $1 (of one quota key when $2 is not NULL), by quota
-- key in byte order.
SELECT quota_key, max_concurrent, rate, burst, updated_at, updated_by FROM quotas
WHERE queue = $1 AND ($2::text IS NULL OR quota_key = $2)
ORDER BY quota_key COLLATE "C"
