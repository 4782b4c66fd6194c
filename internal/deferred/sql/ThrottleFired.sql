-- The latest runs of a throttle key inside the window ending at $4 of $5
-- microseconds, newest first; only the last $6 matter to a limit of $6.
SELECT fired_at FROM deferred_groups
WHERE mode = 'throttle' AND state = 'fired' AND tenant = $1 AND queue = $2 AND key = $3
  AND fired_at > $4::timestamptz - $5::bigint * interval '1 microsecond'
ORDER BY fired_at DESC
LIMIT $6
