-- Set the fairness modes of a queue on this shard, audited as p_actor
-- ('queue.fairness'). p_two_level NULL or p_charge NULL keeps that mode.
-- It takes the queue's fair lock, so no fair claim is halfway through a
-- turn under the old mode. Turning two-level on derives each group's key
-- clock from its keys' rows, so the keys of a group compete from where
-- their charges left them; turning it off keeps the group rows (a later
-- switch back finds them). The debt marks are restated against the queue
-- clock, which every charge keeps in both modes. Setting what is already
-- set changes nothing (changed false) and is audited too.
CREATE OR REPLACE FUNCTION harvest_queue_fairness_set(p_queue text, p_two_level boolean, p_charge text, p_actor text,
                                                      OUT changed boolean, OUT two_level boolean, OUT charge text,
                                                      OUT updated_at timestamptz, OUT updated_by text)
LANGUAGE plpgsql AS $$
DECLARE
    r_old queue_fairness%ROWTYPE;
BEGIN
    IF p_charge IS NOT NULL AND p_charge NOT IN ('claims', 'runtime') THEN
        RAISE EXCEPTION 'charge must be claims or runtime, not %', p_charge USING ERRCODE = '22023';
    END IF;
    PERFORM harvest_queue_lock(p_queue);
    SELECT * INTO r_old FROM queue_fairness f WHERE f.queue = p_queue;
    two_level := coalesce(p_two_level, r_old.two_level, false);
    charge := coalesce(p_charge, r_old.charge, 'claims');
    changed := two_level IS DISTINCT FROM coalesce(r_old.two_level, false)
            OR charge IS DISTINCT FROM coalesce(r_old.charge, 'claims');
    IF changed THEN
        INSERT INTO queue_fairness AS f (queue, two_level, charge, updated_at, updated_by)
        VALUES (p_queue, two_level, charge, now(), p_actor)
        ON CONFLICT (queue) DO UPDATE
        SET two_level = excluded.two_level, charge = excluded.charge,
            updated_at = excluded.updated_at, updated_by = excluded.updated_by;
        IF two_level AND NOT coalesce(r_old.two_level, false) THEN
            INSERT INTO fair_groups AS g (queue, grp, key_clock)
            SELECT p_queue, split_part(s.key, '/', 1), coalesce(max(s.last_start), 0)
            FROM fair_state s WHERE s.queue = p_queue
            GROUP BY split_part(s.key, '/', 1)
            ON CONFLICT (queue, grp) DO UPDATE SET key_clock = excluded.key_clock;
            UPDATE fair_groups g SET key_clock = 0
            WHERE g.queue = p_queue AND NOT EXISTS (
                SELECT 1 FROM fair_state s WHERE s.queue = p_queue AND split_part(s.key, '/', 1) = g.grp
                  AND s.last_start IS NOT NULL);
        END IF;
        UPDATE fair_state s SET in_debt = s.pass > harvest_clock(p_queue)
        WHERE s.queue = p_queue AND s.pass IS NOT NULL
          AND s.in_debt IS DISTINCT FROM (s.pass > harvest_clock(p_queue));
    END IF;
    SELECT f.updated_at, f.updated_by INTO updated_at, updated_by FROM queue_fairness f WHERE f.queue = p_queue;
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, 'queue.fairness', p_queue, NULL,
            jsonb_build_object('two_level', coalesce(r_old.two_level, false), 'charge', coalesce(r_old.charge, 'claims')),
            jsonb_build_object('two_level', two_level, 'charge', charge), 'ok',
            CASE WHEN changed THEN '' ELSE 'unchanged' END);
END
$$;
