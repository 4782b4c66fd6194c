-- Audit rows newest first: ids below $1 (all when NULL), at most $2. The
-- cursor is a coalesce, not "$1 IS NULL OR", so that it stays an index
-- condition in a generic plan: as a filter, a page deep in the audit read
-- every row above it.
SELECT id, at, actor, action, queue, key, old_value, new_value, outcome, message, repeats, last_at FROM audit
WHERE id < coalesce($1::bigint, 9223372036854775807)
ORDER BY id DESC
LIMIT $2
