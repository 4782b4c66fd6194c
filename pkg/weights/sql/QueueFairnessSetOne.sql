-- Set the fairness modes of queue $1 on this shard ($2 two_level, $3
-- charge; NULL keeps that mode), audited as actor $4
-- (harvest_queue_fairness_set: it takes the queue's fair lock).
SELECT changed, two_level, charge, updated_at, updated_by FROM harvest_queue_fairness_set($1, $2, $3, $4)
