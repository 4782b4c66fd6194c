-- Set each tenant's running count to its runs that are not final. Run after
-- TenantRunningLock, in the same transaction: as a new statement it sees
-- every start and finish committed before the locks were granted, and the
-- ones still in flight apply their own +1 or -1 after this commit.
UPDATE tenant_running t SET running = c.n
FROM (
    SELECT t2.tenant,
           (SELECT count(*) FROM runs r
            WHERE r.tenant = t2.tenant
              AND r.status NOT IN ('completed', 'failed', 'cancelled')) AS n
    FROM tenant_running t2
) c
WHERE t.tenant = c.tenant AND t.running <> c.n
RETURNING t.tenant
