-- Give back the tenant's move lock ($1) before the connection closes: the
-- server drops a closed session's locks only once its backend has exited,
-- which may be after the next mover asks.
SELECT pg_advisory_unlock(hashtextextended('harvest.tenantmove' || chr(1) || $1, 0))
