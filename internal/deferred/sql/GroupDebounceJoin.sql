-- A later start of a debounce window: its request replaces the window's,
-- and the quiet period restarts, never past the deadline.
UPDATE deferred_groups
SET request = $2, trace_context = $3::jsonb, size = size + 1,
    fires_at = least($4::timestamptz, coalesce(deadline, 'infinity'))
WHERE pk = $1
RETURNING fires_at, size
