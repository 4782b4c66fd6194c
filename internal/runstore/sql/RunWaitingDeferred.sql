-- The deferred start that holds the run $2 of tenant $1 (its group, still
-- waiting to fire): its mode, key, due time and, for a batch, its size.
SELECT g.mode, g.key, g.fires_at, g.size, g.max_size
FROM deferred_groups g
WHERE g.tenant = $1 AND g.run_id = $2 AND g.state = 'pending'
