-- The tenant's unfinished runs and the shard's total. A statement after the
-- lock sees every start of the tenant that committed before the lock was
-- granted; later ones wait for the lock.
SELECT coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)::bigint,
       coalesce((SELECT sum(running) FROM tenant_running), 0)::bigint
