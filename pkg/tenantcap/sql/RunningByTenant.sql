-- Every tenant with unfinished runs on this shard.
SELECT tenant, running::bigint AS running FROM tenant_running WHERE running > 0 ORDER BY tenant
