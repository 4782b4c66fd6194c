-- One tenant's unfinished runs on this shard.
SELECT coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)::bigint
