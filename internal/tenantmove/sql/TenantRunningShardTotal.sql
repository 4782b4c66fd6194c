-- The shard's count of unfinished runs over all tenants: what its capacity
-- lease must cover.
SELECT harvest_shard_running()
