-- A later start of a debounce window: its request replaces the window's,
-- and the quiet period restarts, never past the deadline. A window opened
-- without one (by a release that wrote none) is capped $5 microseconds
-- after it opened, as new windows are.
UPDATE deferred_groups
SET request = $2, trace_context = $3::jsonb, size = size + 1,
    fires_at = least($4::timestamptz, coalesce(deadline, opened_at + $5::bigint * interval '1 microsecond'))
WHERE pk = $1
RETURNING size
