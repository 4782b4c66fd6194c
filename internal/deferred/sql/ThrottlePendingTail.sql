-- The last $4 waiting starts of a throttle key, latest first, with the slot
-- each one was given.
SELECT fires_at FROM deferred_groups
WHERE mode = 'throttle' AND state = 'pending' AND tenant = $1 AND queue = $2 AND key = $3
ORDER BY pk DESC
LIMIT $4
