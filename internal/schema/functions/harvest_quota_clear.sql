-- Remove the rechecks of (queue, quota key) and its rate bucket, so a quota
-- set again later starts with a full bucket. Clearing a missing quota is
-- not an error.
CREATE OR REPLACE FUNCTION harvest_quota_clear(p_queue text, p_quota_key text, p_actor text,
                                    OUT outcome text, OUT old_value jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    -- quotas before rate_buckets: the order the claim's recheck locks them.
    DELETE FROM quotas q WHERE q.queue = p_queue AND q.quota_key = p_quota_key
    RETURNING harvest_quota_json(q.max_concurrent, q.rate, q.burst) INTO old_value;
    DELETE FROM rate_buckets b WHERE b.queue = p_queue AND b.quota_key = p_quota_key;
    outcome := 'ok';
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, 'quota.clear', p_queue, p_quota_key, old_value, NULL, 'ok',
            CASE WHEN old_value IS NULL THEN 'no quota to clear' ELSE '' END);
END
$$;
