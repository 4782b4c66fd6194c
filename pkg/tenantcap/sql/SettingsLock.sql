-- Lock the row so concurrent changes apply one after the other and each
-- audit row records the value it really replaced.
SELECT value, updated_at, updated_by FROM settings WHERE name = $1 FOR UPDATE
