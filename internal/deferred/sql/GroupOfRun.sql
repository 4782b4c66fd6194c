-- The pending group whose run has this id.
SELECT mode, fires_at FROM deferred_groups
WHERE tenant = $1 AND run_id = $2 AND state = 'pending'
