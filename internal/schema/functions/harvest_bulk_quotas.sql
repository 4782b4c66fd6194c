-- The quotas of the quota keys p_keys in p_queue, for the rechecks of the
-- bulk steps (harvest_claim_bulk, harvest_claim_bulk_fair,
-- harvest_claim_bulk_group): one row per key with a quota
-- row, in key order, each quota row locked (FOR NO KEY UPDATE, as
-- harvest_quota_recheck locks it) before its running rows are counted
-- (running: 0 without a cap) and its bucket is locked and refilled to
-- p_now (tokens: NULL without a rate; a bucket not written yet is full).
-- The same numbers each single claim's recheck would start from.
--
-- The lock order of the quota rows (docs/claim.md, "Lock order"): a claim
-- waits for a quota row only when its (queue, quota key) sorts after that
-- of every quota row its transaction holds already (harvest.quota_top,
-- kept here and by harvest_quota_recheck until the commit). With
-- p_ordered (the ordinary claims, which run side by side) a key that
-- sorts before it is taken only when no other transaction holds it
-- (SKIP LOCKED); when one does, the key comes back with busy set and
-- nothing else, and the caller ends its claim before that key's first row
-- (waiting there closed a cycle with an ordinary batch that met the keys
-- the other way round: TestOrdinaryBatchesDoNotDeadlockOnQuotaRows). The
-- fair claims of a queue take turns on its fair lock and wait as before.
-- A bucket is only locked under its quota row, so it needs no order of
-- its own.
DROP FUNCTION IF EXISTS harvest_bulk_quotas(text, text[], timestamptz);
CREATE OR REPLACE FUNCTION harvest_bulk_quotas(p_queue text, p_keys text[], p_now timestamptz,
                                               p_ordered boolean DEFAULT false,
                                               OUT quota_key text, OUT max_concurrent integer,
                                                        OUT running integer, OUT rate double precision,
                                                        OUT tokens double precision, OUT busy boolean)
RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE
    v_top   text[] := nullif(current_setting('harvest.quota_top', true), '')::text[];
    v_key   text;
    r_quota record;
BEGIN
    -- One key at a time, in key order, so the keys after v_top are waited
    -- for in order and the keys before it are never waited for.
    FOR v_key IN SELECT DISTINCT k FROM unnest(p_keys) k ORDER BY k LOOP
        IF p_ordered AND ARRAY[p_queue, v_key] < v_top THEN
            SELECT q.quota_key, q.max_concurrent, q.rate, q.burst INTO r_quota FROM quotas q
            WHERE q.queue = p_queue AND q.quota_key = v_key
            FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Held by another transaction, or no quota row at all.
                CONTINUE WHEN NOT EXISTS (SELECT 1 FROM quotas q WHERE q.queue = p_queue AND q.quota_key = v_key);
                quota_key := v_key;
                max_concurrent := NULL;
                running := NULL;
                rate := NULL;
                tokens := NULL;
                busy := true;
                RETURN NEXT;
                CONTINUE;
            END IF;
        ELSE
            SELECT q.quota_key, q.max_concurrent, q.rate, q.burst INTO r_quota FROM quotas q
            WHERE q.queue = p_queue AND q.quota_key = v_key
            FOR NO KEY UPDATE;
            CONTINUE WHEN NOT FOUND;
            v_top := greatest(v_top, ARRAY[p_queue, v_key]);
        END IF;
        quota_key := r_quota.quota_key;
        max_concurrent := r_quota.max_concurrent;
        rate := r_quota.rate;
        busy := false;
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
    PERFORM set_config('harvest.quota_top', coalesce(v_top::text, ''), true);
END
$$;
