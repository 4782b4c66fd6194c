-- Open a group. For debounce and batch at most one group of a key is
-- pending (deferred_groups_open); the caller holds the tenant's count row,
-- so no other accept of the tenant can open one meanwhile.
-- $1 tenant, $2 run id, $3 mode, $4 queue, $5 key, $6 state, $7 fires_at,
-- $8 deadline, $9 throttle limit, $10 period us, $11 max size,
-- $12 request, $13 input, $14 trace context, $15 now.
INSERT INTO deferred_groups (tenant, run_id, mode, queue, key, state, fires_at, deadline, throttle_limit,
                             period_us, max_size, request, input, trace_context, opened_at, fired_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14::jsonb, $15,
        CASE WHEN $6 = 'fired' THEN $15::timestamptz END)
RETURNING pk
