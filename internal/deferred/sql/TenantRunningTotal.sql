-- The shard's count of unfinished runs over all tenants, as this
-- transaction sees it (its own holds and starts included).
SELECT coalesce(sum(running), 0)::bigint FROM tenant_running
