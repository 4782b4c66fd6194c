-- The shard's count of unfinished runs over all tenants, as this
-- transaction sees it (its own holds and starts included), and the shard's
-- capacity lease.
SELECT coalesce(sum(running), 0)::bigint, harvest_shard_lease() FROM tenant_running
