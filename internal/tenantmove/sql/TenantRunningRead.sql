-- The tenant's count of unfinished runs on this shard (0 without a row).
SELECT coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)::bigint
