-- Set the override of ($1 queue, $2 key) to $3, audited as actor $4; the
-- queue's cap is checked under the queue's writer lock.
SELECT outcome, old_weight, overrides FROM harvest_weight_set($1, $2, $3, $4)
