-- Lease the pending rows p_ids (locked by the caller) to p_worker, in one
-- update, as the bulk and lone steps of a batch do; returns them as claims
-- in the order of p_ids, each with lag p_lags[i] (0 when p_lags is NULL)
-- and what the worker needs of its run, read in the same statement (so the
-- worker reads nothing after). The runs are read, not written, as
-- harvest_run_claimed reads the single claim's run: the status is
-- 'running' for an unfinished run (its task has just been leased:
-- runs_seen reads it so) and the final status of a run cancelled while its
-- task waited, which the worker drops. In a queue charged by runtime,
-- p_secs[i] is the estimate the row's claim billed, kept on the row for
-- its settlement (NULL: the rows bill 1 per claim, or nothing).
-- The single claim leases its one row itself (harvest_claim_step).
DROP FUNCTION IF EXISTS harvest_lease_rows(bigint[], double precision[], text, interval);
CREATE OR REPLACE FUNCTION harvest_lease_rows(p_ids bigint[], p_lags double precision[], p_worker text,
                                              p_lease interval, p_secs double precision[] DEFAULT NULL)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
-- The bulk steps that call this force generic plans, made once per
-- connection with the statistics of that moment. Made on a small shard,
-- the plan joined the ids to the whole of tasks and of runs (by
-- sequential scans, or with those ruled out by full index scans) and kept
-- doing so as the tables grew, until a vacuum or analyze made it again.
-- So the tasks are found by their ids in the index condition and each run
-- by a probe of its own; sequential scans are ruled out by the claim's
-- entry points, which this runs under (harvest_claim_batch), so no table
-- is scanned whatever the statistics (TestClaimPlansOutliveTheShardsGrowth).
AS $$
DECLARE
    v_at  timestamptz := clock_timestamp();
    -- One random draw for the whole call: each row's lease token is its
    -- first 96 bits (90 of them random) followed by the row's place in
    -- p_ids, so the tokens of a call differ from each other, and from
    -- every other call's tokens but with odds of 2^-90. A token is only
    -- compared for equality with the task's current one (outcomes,
    -- heartbeats) and never leaves the worker that holds the lease. A
    -- gen_random_uuid() per row cost about 4 us a task, a fifteenth of the
    -- claim and completion of a flood task (docs/benchmarks.md, "One
    -- session, Harvest's statements beside River's").
    v_tok text        := left(gen_random_uuid()::text, 28);
BEGIN
    RETURN QUERY
    WITH p AS (
        SELECT p.id, p.ord, coalesce(p_lags[p.ord], 0) AS lag, p_secs[p.ord] AS secs,
               v_at + (p.ord - 1) * interval '1 microsecond' AS at
        FROM unnest(p_ids) WITH ORDINALITY AS p(id, ord)
    ), u AS (
        UPDATE tasks t SET
            state            = 'running',
            attempt          = t.attempt + 1,
            lease_token      = (v_tok || lpad(to_hex(p.ord), 8, '0'))::uuid,
            -- The lease runs from the moment the row is leased, not from
            -- the start of the claim's transaction, which may have waited
            -- on the queue's locks for longer than a short lease.
            lease_expires_at = p.at + p_lease,
            claimed_by       = p_worker,
            claimed_at       = p.at,
            charged_secs     = p.secs
        FROM p WHERE t.id = p.id AND t.id = ANY (p_ids)
        RETURNING t.*, p.ord, p.lag
    )
    SELECT 'ok'::text, u.lag, '[]'::jsonb, u.id, u.run_pk, u.queue, u.fairness_key, u.quota_key, u.priority,
           u.continuation, u.due_at, u.sticky_worker, u.sticky_until, u.step, u.input, u.attempt,
           u.lease_token, u.lease_expires_at, u.trace_context,
           x.tenant, x.id, x.name,
           CASE WHEN x.status IN ('queued', 'running') THEN 'running' ELSE x.status END,
           x.max_attempts, x.timeout_ms
    FROM u
    -- OFFSET 0 keeps the subquery a probe of the run's primary key.
    CROSS JOIN LATERAL (SELECT r.tenant, r.id, r.name, r.status, r.max_attempts, r.timeout_ms FROM runs r
                        WHERE r.pk = u.run_pk OFFSET 0) x
    ORDER BY u.ord;
END
$$;
