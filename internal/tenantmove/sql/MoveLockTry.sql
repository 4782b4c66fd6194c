-- Take the session lock that lets one mover at a time work on a tenant
-- ($1). Session level on purpose: it outlives the move's transactions and
-- goes with the connection, so a mover that dies frees it.
SELECT pg_try_advisory_lock(hashtextextended('harvest.tenantmove' || chr(1) || $1, 0))
