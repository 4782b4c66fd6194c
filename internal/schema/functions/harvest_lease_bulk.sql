-- Lease the given pending rows (already locked by the caller) in one
-- update, mark their runs running, and return them in the order of p_ids.
CREATE OR REPLACE FUNCTION harvest_lease_bulk(p_ids bigint[], p_worker text, p_lease interval)
RETURNS SETOF tasks
LANGUAGE plpgsql AS $$
DECLARE
    v_rows tasks[];
    v_runs bigint[];
BEGIN
    WITH u AS (
        UPDATE tasks SET
            state            = 'running',
            attempt          = attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = clock_timestamp()
        WHERE id = ANY (p_ids) AND state = 'pending'
        RETURNING *
    )
    SELECT array_agg(u::tasks ORDER BY array_position(p_ids, u.id)), array_agg(u.run_pk ORDER BY u.run_pk)
    INTO v_rows, v_runs FROM u;
    UPDATE runs SET
        status     = 'running',
        attempts   = attempts + 1,
        claimed_at = coalesce(claimed_at, now())
    WHERE pk = ANY (v_runs) AND status IN ('queued', 'running');
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;
