-- Lease the pending rows p_ids (locked by the caller) to p_worker and mark
-- their runs running, in one update of each table, as the bulk and lone
-- steps of a batch do; returns them as claims in the order of p_ids, each
-- with lag p_lags[i] (0 when p_lags is NULL) and what the worker needs of
-- its run (from the runs' update, so the worker reads nothing after). In a queue charged by
-- runtime, p_secs[i] is the estimate the row's claim billed, kept on the
-- row for its settlement (NULL: the rows bill 1 per claim, or nothing).
-- The single claim leases its one row itself (harvest_claim_step).
DROP FUNCTION IF EXISTS harvest_lease_rows(bigint[], double precision[], text, interval);
CREATE OR REPLACE FUNCTION harvest_lease_rows(p_ids bigint[], p_lags double precision[], p_worker text,
                                              p_lease interval, p_secs double precision[] DEFAULT NULL)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH p AS (
        SELECT p.id, p.ord, coalesce(p_lags[p.ord], 0) AS lag, p_secs[p.ord] AS secs
        FROM unnest(p_ids) WITH ORDINALITY AS p(id, ord)
    ), u AS (
        UPDATE tasks t SET
            state            = 'running',
            attempt          = t.attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = v_at + (p.ord - 1) * interval '1 microsecond',
            charged_secs     = p.secs
        FROM p WHERE t.id = p.id
        RETURNING t.*, p.ord, p.lag
    ), r AS (
        -- A run's first claim time is its task's stamp (batch order, taken
        -- under the queue lock), not now(): a batch that waited for the
        -- lock began before the batch that held it.
        UPDATE runs SET
            status     = 'running',
            attempts   = runs.attempts + 1,
            claimed_at = coalesce(runs.claimed_at, g.claimed_at)
        FROM (SELECT u.run_pk, min(u.claimed_at) AS claimed_at FROM u GROUP BY u.run_pk) g
        WHERE runs.pk = g.run_pk AND runs.status IN ('queued', 'running')
        RETURNING runs.pk, runs.tenant, runs.id, runs.name, runs.status, runs.max_attempts, runs.timeout_ms
    )
    SELECT 'ok'::text, u.lag, '[]'::jsonb, u.id, u.run_pk, u.queue, u.fairness_key, u.quota_key, u.priority,
           u.continuation, u.due_at, u.sticky_worker, u.sticky_until, u.step, u.input, u.attempt,
           u.lease_token, u.lease_expires_at, u.trace_context,
           coalesce(r.tenant, f.tenant), coalesce(r.id, f.id), coalesce(r.name, f.name),
           coalesce(r.status, f.status), coalesce(r.max_attempts, f.max_attempts),
           coalesce(r.timeout_ms, f.timeout_ms)
    FROM u
    LEFT JOIN r ON r.pk = u.run_pk
    -- A run the update left alone (final already: cancelled while its
    -- task waited) is read as it is; the others come from the update.
    LEFT JOIN LATERAL (
        SELECT x.tenant, x.id, x.name, x.status, x.max_attempts, x.timeout_ms
        FROM runs x WHERE x.pk = u.run_pk AND r.pk IS NULL) f ON true
    ORDER BY u.ord;
END
$$;
