-- Set (or replace) the override of (queue, key). A new key on a queue that
-- already holds 1,000 overrides is refused with 'cap_reached'; replacing an
-- existing override never is. overrides is the queue's count afterwards.
CREATE OR REPLACE FUNCTION harvest_weight_set(p_queue text, p_key text, p_weight double precision, p_actor text,
                                   OUT outcome text, OUT old_weight double precision, OUT overrides integer)
LANGUAGE plpgsql AS $$
BEGIN
    overrides := harvest_weight_lock(p_queue);
    -- A separate statement after the lock: it sees what the previous holder
    -- committed.
    SELECT w.weight INTO old_weight FROM weight_overrides w WHERE w.queue = p_queue AND w.key = p_key;
    IF old_weight IS NULL AND overrides >= 1000 THEN
        outcome := 'cap_reached';
        -- Folded like every refusal (the window of
        -- weights.DefaultRefusalFold; 409 is the write's status).
        PERFORM harvest_audit_refused(p_actor, 'weight.set', p_queue, p_key, NULL, jsonb_build_object('weight', p_weight),
                format('cap_reached: the queue already holds %s overrides, the most allowed; clear one first', overrides),
                interval '1 minute', 409);
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
