-- Record a refused change by p_actor, folded: when the actor's latest
-- refused row of p_action is younger than p_window, its repeats go up by
-- one and nothing is added; otherwise a new row. Returns the row's id. The
-- advisory lock makes concurrent refusals of one actor and action (through
-- several gateways) fold into one row too.
CREATE OR REPLACE FUNCTION harvest_audit_refused(p_actor text, p_action text, p_queue text, p_key text,
                                                 p_old jsonb, p_new jsonb, p_message text, p_window interval)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('harvest.audit_refused:' || p_actor || ':' || p_action, 0));
    SELECT a.id INTO v_id FROM audit a
    WHERE a.actor = p_actor AND a.action = p_action AND a.outcome = 'refused' AND a.at > now() - p_window
    ORDER BY a.at DESC LIMIT 1;
    IF v_id IS NOT NULL THEN
        UPDATE audit SET repeats = repeats + 1 WHERE id = v_id;
        RETURN v_id;
    END IF;
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, p_action, p_queue, p_key, p_old, p_new, 'refused', p_message)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
