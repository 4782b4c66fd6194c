-- Weight overrides and quotas as administrators write them: one function per
-- change, so that the change, the cap check and its audit row are one
-- statement (one round trip, atomic on a pool or inside the caller's
-- transaction). A refused change is not an exception: the function writes
-- the refusal's audit row and reports the outcome, so the row survives.
--
-- Outcomes reported by the functions: 'ok', 'cap_reached'.
-- Audit rows: action 'weight.set', 'weight.clear', 'quota.set',
-- 'quota.clear'; outcome 'ok' or 'refused'.

-- weight_override_counts: how many overrides each queue holds. The trigger
-- below keeps it exact whatever statement writes weight_overrides, and the
-- check makes the cap of 1,000 overrides per queue (the same number as
-- fairkeys.MaxOverridesPerQueue) a database invariant: no race of writers
-- can pass it. The setters also lock the queue's row before they look at
-- the count, so writers of one queue take turns and a refusal is decided on
-- the committed count, not on a snapshot.
CREATE TABLE weight_override_counts (
    queue text    PRIMARY KEY,
    n     integer NOT NULL DEFAULT 0,
    CONSTRAINT weight_override_cap CHECK (n >= 0 AND n <= 1000)
);

INSERT INTO weight_override_counts (queue, n)
SELECT queue, count(*) FROM weight_overrides GROUP BY queue;

CREATE FUNCTION harvest_weight_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE weight_override_counts SET n = n - 1 WHERE queue = OLD.queue;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO weight_override_counts AS c (queue, n) VALUES (NEW.queue, 1)
        ON CONFLICT (queue) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER weight_overrides_count
    AFTER INSERT OR DELETE OR UPDATE OF queue ON weight_overrides
    FOR EACH ROW EXECUTE FUNCTION harvest_weight_count();

-- Take the queue's turn among override writers; returns the current count.
CREATE FUNCTION harvest_weight_lock(p_queue text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    INSERT INTO weight_override_counts (queue, n) VALUES (p_queue, 0)
    ON CONFLICT (queue) DO NOTHING;
    SELECT n INTO v_n FROM weight_override_counts WHERE queue = p_queue FOR UPDATE;
    RETURN v_n;
END
$$;

-- Set (or replace) the override of (queue, key). A new key on a queue that
-- already holds 1,000 overrides is refused with 'cap_reached'; replacing an
-- existing override never is. overrides is the queue's count afterwards.
CREATE FUNCTION harvest_weight_set(p_queue text, p_key text, p_weight double precision, p_actor text,
                                   OUT outcome text, OUT old_weight double precision, OUT overrides integer)
LANGUAGE plpgsql AS $$
BEGIN
    overrides := harvest_weight_lock(p_queue);
    -- A separate statement after the lock: it sees what the previous holder
    -- committed.
    SELECT w.weight INTO old_weight FROM weight_overrides w WHERE w.queue = p_queue AND w.key = p_key;
    IF old_weight IS NULL AND overrides >= 1000 THEN
        outcome := 'cap_reached';
        INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
        VALUES (p_actor, 'weight.set', p_queue, p_key, NULL, jsonb_build_object('weight', p_weight), 'refused',
                format('cap_reached: the queue already holds %s overrides, the most allowed; clear one first', overrides));
        RETURN;
    END IF;
    INSERT INTO weight_overrides (queue, key, weight, updated_at, updated_by)
    VALUES (p_queue, p_key, p_weight, now(), p_actor)
    ON CONFLICT (queue, key) DO UPDATE
    SET weight = EXCLUDED.weight, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by;
    IF old_weight IS NULL THEN
        overrides := overrides + 1;
    END IF;
    outcome := 'ok';
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, 'weight.set', p_queue, p_key,
            CASE WHEN old_weight IS NULL THEN NULL ELSE jsonb_build_object('weight', old_weight) END,
            jsonb_build_object('weight', p_weight), 'ok',
            CASE WHEN old_weight = p_weight THEN 'unchanged' ELSE '' END);
END
$$;

-- Remove the override of (queue, key); the key weighs 1 from its next
-- charge. Clearing a key without an override is not an error (a retry of a
-- clear must succeed); old_weight is then NULL.
CREATE FUNCTION harvest_weight_clear(p_queue text, p_key text, p_actor text,
                                     OUT outcome text, OUT old_weight double precision, OUT overrides integer)
LANGUAGE plpgsql AS $$
BEGIN
    -- Same lock order as the setter (count row, then override row), so a
    -- set and a clear of one key cannot deadlock.
    overrides := harvest_weight_lock(p_queue);
    DELETE FROM weight_overrides w WHERE w.queue = p_queue AND w.key = p_key RETURNING w.weight INTO old_weight;
    IF old_weight IS NOT NULL THEN
        overrides := overrides - 1;
    END IF;
    outcome := 'ok';
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, 'weight.clear', p_queue, p_key,
            CASE WHEN old_weight IS NULL THEN NULL ELSE jsonb_build_object('weight', old_weight) END,
            NULL, 'ok', CASE WHEN old_weight IS NULL THEN 'no override to clear' ELSE '' END);
END
$$;

-- The settings of a quota as JSON, for audit rows and change reports.
CREATE FUNCTION harvest_quota_json(p_max integer, p_rate double precision, p_burst double precision) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('max_concurrent', p_max, 'rate', p_rate, 'burst', p_burst)
$$;

-- Set (replace) the rechecks of (queue, quota key): a NULL field removes
-- that limit. The claim reads the row at its next recheck.
CREATE FUNCTION harvest_quota_set(p_queue text, p_quota_key text, p_max integer, p_rate double precision,
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

-- Remove the rechecks of (queue, quota key) and its rate bucket, so a quota
-- set again later starts with a full bucket. Clearing a missing quota is
-- not an error.
CREATE FUNCTION harvest_quota_clear(p_queue text, p_quota_key text, p_actor text,
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

-- Claims of the last minute per key, for the per-key view: the tasks of a
-- queue claimed since a time, read from this index alone (claimed_at is the
-- latest claim of the task, so a retry within the window counts once).
CREATE INDEX tasks_claimed_at ON tasks (queue, claimed_at, fairness_key) WHERE claimed_at IS NOT NULL;
