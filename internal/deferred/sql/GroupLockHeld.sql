-- One pending group the caller is entitled to wait for (it holds the
-- tenant's count row or the throttle key).
SELECT pk, tenant, run_id, mode, request, input, trace_context
FROM deferred_groups
WHERE pk = $1 AND state = 'pending'
FOR UPDATE
