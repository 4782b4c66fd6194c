-- The first $4 waiting starts of a throttle key in arrival order, locked
-- for a firing pass, with the limit and period each one carries.
SELECT pk, fires_at, throttle_limit, period_us FROM deferred_groups
WHERE mode = 'throttle' AND state = 'pending' AND tenant = $1 AND queue = $2 AND key = $3
ORDER BY pk
LIMIT $4
FOR UPDATE
