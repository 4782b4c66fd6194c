-- Lock the running-count rows to fix ($1; NULL: every row) in byte order,
-- the order every statement that holds several tenants' rows takes them
-- (runstore's TenantRunningLock), so no start or finish changes a count
-- between the recount and its write and none deadlocks with it.
SELECT tenant FROM tenant_running
WHERE $1::text[] IS NULL OR tenant = ANY($1)
ORDER BY tenant COLLATE "C" FOR UPDATE
