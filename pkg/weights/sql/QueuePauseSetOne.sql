-- Pause ($2 true) or resume queue $1 on this shard, audited as actor $3
-- (harvest_queue_pause: it waits for the queue's claims under way).
SELECT changed, paused_at, paused_by FROM harvest_queue_pause($1, $2, $3)
