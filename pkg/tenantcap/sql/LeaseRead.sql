-- This shard's lease row and its count of unfinished runs.
SELECT l.granted, l.returned, harvest_shard_running() AS running
FROM admission_lease l
