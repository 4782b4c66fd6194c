-- Unfinished runs on this shard, over every tenant.
SELECT harvest_shard_running()
