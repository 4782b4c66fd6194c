-- Every tenant's count on this shard.
SELECT tenant, running::bigint AS running FROM tenant_running ORDER BY tenant
