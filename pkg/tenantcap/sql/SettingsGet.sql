-- The stored admission configuration, if any.
SELECT value, updated_at, updated_by FROM settings WHERE name = $1
