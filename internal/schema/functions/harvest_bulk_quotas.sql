-- The quotas of the quota keys p_keys in p_queue, for the rechecks of the
-- bulk steps (harvest_claim_bulk, harvest_claim_bulk_fair,
-- harvest_claim_bulk_group): one row per key with a quota
-- row, in key order, each quota row locked (FOR NO KEY UPDATE, as
-- harvest_quota_recheck locks it) before its running rows are counted
-- (running: 0 without a cap) and its bucket is locked and refilled to
-- p_now (tokens: NULL without a rate; a bucket not written yet is full).
-- The same numbers each single claim's recheck would start from.
CREATE OR REPLACE FUNCTION harvest_bulk_quotas(p_queue text, p_keys text[], p_now timestamptz,
                                               OUT quota_key text, OUT max_concurrent integer,
                                                        OUT running integer, OUT rate double precision,
                                                        OUT tokens double precision)
RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE
    r_quota record;
BEGIN
    FOR r_quota IN
        SELECT q.quota_key, q.max_concurrent, q.rate, q.burst FROM quotas q
        WHERE q.queue = p_queue AND q.quota_key = ANY (p_keys)
        ORDER BY q.quota_key
        FOR NO KEY UPDATE
    LOOP
        quota_key := r_quota.quota_key;
        max_concurrent := r_quota.max_concurrent;
        rate := r_quota.rate;
        running := CASE WHEN r_quota.max_concurrent IS NULL THEN 0 ELSE (
            SELECT count(*)::integer FROM tasks x
            WHERE x.queue = p_queue AND x.quota_key = r_quota.quota_key AND x.quota_key <> ''
              AND x.state = 'running') END;
        tokens := CASE WHEN r_quota.rate IS NULL THEN NULL ELSE coalesce((
            SELECT least(r_quota.burst,
                         b.tokens + r_quota.rate * harvest_secs(greatest(harvest_us(p_now, b.updated_at), 0)))
            FROM rate_buckets b
            WHERE b.queue = p_queue AND b.quota_key = r_quota.quota_key
            FOR NO KEY UPDATE), r_quota.burst) END;
        RETURN NEXT;
    END LOOP;
END
$$;
