-- The pending debounce window or batch of a key, locked.
SELECT pk, run_id, fires_at, deadline, max_size, size, request
FROM deferred_groups
WHERE tenant = $1 AND queue = $2 AND mode = $3 AND key = $4 AND state = 'pending'
FOR UPDATE
