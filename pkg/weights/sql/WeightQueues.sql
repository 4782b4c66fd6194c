-- The queues that hold weight overrides on this shard, in name order, at
-- most $1 of them.
SELECT DISTINCT queue FROM weight_overrides ORDER BY queue LIMIT $1
