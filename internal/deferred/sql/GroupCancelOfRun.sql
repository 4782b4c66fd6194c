-- Close the pending group of a run that was cancelled while it waited.
UPDATE deferred_groups SET state = 'cancelled', fired_at = now()
WHERE tenant = $1 AND run_id = $2 AND state = 'pending'
