-- Groups due at $1, oldest first (no lock: each is locked on its own).
SELECT pk, tenant, mode, queue, key FROM deferred_groups
WHERE state = 'pending' AND fires_at <= $1
ORDER BY fires_at, pk
LIMIT $2
