-- The shard's count of unfinished runs over all tenants, as this
-- transaction sees it (its own holds and starts included), and the shard's
-- capacity lease.
SELECT harvest_shard_running() AS total, harvest_shard_lease() AS lease
