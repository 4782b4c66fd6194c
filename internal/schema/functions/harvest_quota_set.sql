-- Set (replace) the rechecks of (queue, quota key): a NULL field removes
-- that limit. The claim reads the row at its next recheck.
CREATE OR REPLACE FUNCTION harvest_quota_set(p_queue text, p_quota_key text, p_max integer, p_rate double precision,
                                  p_burst double precision, p_actor text,
                                  OUT outcome text, OUT old_value jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst, updated_at, updated_by)
    VALUES (p_queue, p_quota_key, p_max, p_rate, p_burst, now(), p_actor)
    ON CONFLICT (queue, quota_key) DO NOTHING;
    IF NOT FOUND THEN
        -- The row exists (or a concurrent insert just committed it): lock
        -- it, keep what it held for the audit row, then replace it.
        SELECT harvest_quota_json(q.max_concurrent, q.rate, q.burst) INTO old_value
        FROM quotas q WHERE q.queue = p_queue AND q.quota_key = p_quota_key FOR UPDATE;
        UPDATE quotas SET max_concurrent = p_max, rate = p_rate, burst = p_burst,
                          updated_at = now(), updated_by = p_actor
        WHERE queue = p_queue AND quota_key = p_quota_key;
    END IF;
    outcome := 'ok';
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, 'quota.set', p_queue, p_quota_key, old_value,
            harvest_quota_json(p_max, p_rate, p_burst), 'ok',
            CASE WHEN old_value = harvest_quota_json(p_max, p_rate, p_burst) THEN 'unchanged' ELSE '' END);
END
$$;
