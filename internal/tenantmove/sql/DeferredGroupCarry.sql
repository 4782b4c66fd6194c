-- Write deferred groups (JSON rows of DeferredGroupRead) with new pks,
-- unless the shard has the group's run id already (a rerun).
INSERT INTO deferred_groups (tenant, run_id, mode, queue, key, state, fires_at, deadline, throttle_limit,
                             period_us, max_size, size, request, input, trace_context, opened_at, fired_at)
SELECT tenant, run_id, mode, queue, key, state, fires_at, deadline, throttle_limit,
       period_us, max_size, size, request, input, trace_context, opened_at, fired_at
FROM jsonb_populate_recordset(NULL::deferred_groups, $1::jsonb)
ORDER BY pk
ON CONFLICT DO NOTHING
