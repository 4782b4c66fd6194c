-- The pause of queue $1 on this shard: one row when it is paused, none
-- when it runs.
SELECT paused_at, paused_by FROM queue_pauses WHERE queue = $1
