-- One pending group for a firer, skipped when another firer holds it. Under
-- READ COMMITTED a row that another firer fired meanwhile is rechecked
-- after its lock and no longer matches state = 'pending'.
SELECT pk, tenant, run_id, mode, request, input, trace_context
FROM deferred_groups
WHERE pk = $1 AND state = 'pending'
FOR UPDATE SKIP LOCKED
