-- The fairness modes of queue $1 on this shard; no row for a queue never
-- configured (one-level, charged per claim).
SELECT two_level, charge, updated_at, updated_by FROM queue_fairness WHERE queue = $1
