-- Remove the override of (queue, key); the key weighs 1 from its next
-- charge. Clearing a key without an override is not an error (a retry of a
-- clear must succeed); old_weight is then NULL.
CREATE OR REPLACE FUNCTION harvest_weight_clear(p_queue text, p_key text, p_actor text,
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
