-- Every tenant's priority ceiling an operator set (tenant_priority, shard
-- 0), at most $1 rows, by tenant.
SELECT tenant, max_priority, updated_at, updated_by
FROM tenant_priority
ORDER BY tenant COLLATE "C"
LIMIT $1
