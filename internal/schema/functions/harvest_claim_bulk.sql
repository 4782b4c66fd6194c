-- One ordinary bulk step of a batch: the first unlocked rows of the seek
-- index, up to p_n, as that many single ordinary claims would take them,
-- stopping before the first row with a quota key (its rechecks are the
-- single claim's). The caller checked that there is no ageing and no row
-- pinned to the worker. Fair steps are harvest_claim_bulk_fair's.
CREATE OR REPLACE FUNCTION harvest_claim_bulk(p_queue text, p_worker text, p_now timestamptz,
                                              p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT y.id, y.quota_key, row_number() OVER () AS o FROM (
            SELECT x.id, x.quota_key FROM tasks x
            WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
            ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
            LIMIT p_n FOR UPDATE SKIP LOCKED) y
    ), p AS (
        SELECT picked.id, picked.o FROM picked
        WHERE picked.o < coalesce((SELECT min(q.o) FROM picked q WHERE q.quota_key <> ''), p_n + 1)
    ), u AS (
        UPDATE tasks t SET
            state            = 'running',
            attempt          = t.attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = now() + p_lease,
            claimed_by       = p_worker,
            claimed_at       = clock_timestamp()
        FROM p WHERE t.id = p.id
        RETURNING t.*, p.o
    ), r AS (
        UPDATE runs SET
            status     = 'running',
            attempts   = attempts + 1,
            claimed_at = coalesce(claimed_at, now())
        WHERE pk IN (SELECT u.run_pk FROM u) AND status IN ('queued', 'running')
    )
    SELECT 'ok'::text, 0::double precision, '[]'::jsonb, u.id, u.run_pk, u.queue, u.fairness_key, u.quota_key,
           u.priority, u.continuation, u.due_at, u.sticky_worker, u.sticky_until, u.step, u.input, u.attempt,
           u.lease_token, u.lease_expires_at, u.trace_context
    FROM u ORDER BY u.o;
END
$$;
