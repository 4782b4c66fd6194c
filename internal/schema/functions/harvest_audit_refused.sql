-- Record a refused change, folded: when the latest refused row of the same
-- actor, action and status (p_status, the HTTP status of the refusal; 0
-- when the writer has none) is younger than p_window, its repeats go up by
-- one and its last_at moves to now, and nothing is added; otherwise a new
-- row. What varies between two refusals (the queue, the key, the message,
-- the body) is not part of the match, so a caller cannot defeat the fold
-- by varying it: the row keeps what the first refusal of its window sent.
-- The window runs from the row's first refusal, so an actor's steady flood
-- leaves one row per window and status. Returns the row's id. The advisory
-- lock makes concurrent refusals of one actor, action and status (through
-- several gateways) fold into one row too. Callers bound the texts and
-- documents they pass (internal/auditdoc).
DROP FUNCTION IF EXISTS harvest_audit_refused(text, text, text, text, jsonb, jsonb, text, interval);
CREATE OR REPLACE FUNCTION harvest_audit_refused(p_actor text, p_action text, p_queue text, p_key text,
                                                 p_old jsonb, p_new jsonb, p_message text, p_window interval,
                                                 p_status integer DEFAULT 0)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'harvest.audit_refused:' || p_actor || ':' || p_action || ':' || p_status, 0));
    SELECT a.id INTO v_id FROM audit a
    WHERE a.actor = p_actor AND a.action = p_action AND a.outcome = 'refused' AND a.status = p_status
      AND a.at > now() - p_window
    ORDER BY a.at DESC LIMIT 1;
    IF v_id IS NOT NULL THEN
        UPDATE audit SET repeats = repeats + 1, last_at = now() WHERE id = v_id;
        RETURN v_id;
    END IF;
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message, status)
    VALUES (p_actor, p_action, p_queue, p_key, p_old, p_new, 'refused', p_message, p_status)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
