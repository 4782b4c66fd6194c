-- Set (p_weight) or clear (p_weight NULL) the weight of a group in a
-- two-level queue on this shard, audited as p_actor ('group_weight.set',
-- 'group_weight.clear'). The weight applies from the group's next charge.
-- Clearing a group without a weight is not an error (old_weight NULL).
CREATE OR REPLACE FUNCTION harvest_group_weight_set(p_queue text, p_group text, p_weight double precision, p_actor text,
                                                    OUT old_weight double precision)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_weight IS NULL THEN
        DELETE FROM group_weights w WHERE w.queue = p_queue AND w.grp = p_group RETURNING w.weight INTO old_weight;
    ELSE
        SELECT w.weight INTO old_weight FROM group_weights w WHERE w.queue = p_queue AND w.grp = p_group FOR UPDATE;
        INSERT INTO group_weights (queue, grp, weight, updated_at, updated_by)
        VALUES (p_queue, p_group, p_weight, now(), p_actor)
        ON CONFLICT (queue, grp) DO UPDATE
        SET weight = excluded.weight, updated_at = excluded.updated_at, updated_by = excluded.updated_by;
    END IF;
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, CASE WHEN p_weight IS NULL THEN 'group_weight.clear' ELSE 'group_weight.set' END, p_queue, p_group,
            CASE WHEN old_weight IS NULL THEN NULL ELSE jsonb_build_object('weight', old_weight) END,
            CASE WHEN p_weight IS NULL THEN NULL ELSE jsonb_build_object('weight', p_weight) END, 'ok',
            CASE WHEN p_weight IS NULL AND old_weight IS NULL THEN 'no weight to clear'
                 WHEN old_weight = p_weight THEN 'unchanged' ELSE '' END);
END
$$;
