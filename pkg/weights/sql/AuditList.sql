-- Audit rows newest first: ids below $1 (all when NULL), at most $2.
SELECT id, at, actor, action, queue, key, old_value, new_value, outcome, message, repeats, last_at FROM audit
WHERE $1::bigint IS NULL OR id < $1
ORDER BY id DESC
LIMIT $2
