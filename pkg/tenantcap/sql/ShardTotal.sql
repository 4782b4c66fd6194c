-- Unfinished runs on this shard, over every tenant.
SELECT coalesce(sum(running), 0)::bigint FROM tenant_running
