-- The shard's unfinished runs, as admission counts them: the total the
-- trigger on tenant_running keeps in the seventeen rows of shard_running
-- (harvest_shard_running), rather than a sum over every tenant's row.
SELECT harvest_shard_running() AS unfinished
