-- The shard's count of unfinished runs over all tenants: what its capacity
-- lease must cover.
SELECT coalesce(sum(running), 0)::bigint FROM tenant_running
