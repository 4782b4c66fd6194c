-- Pause (p_paused) or resume a queue on this shard, audited as p_actor.
-- The exclusive pause lock waits for the claims of the queue already under
-- way, so when this commits no claim is still taking the queue's tasks on
-- the shard, and every later claim reads the pause. Pausing a paused queue
-- and resuming a running one change nothing (changed false) but are
-- audited too, so a retry after a partial answer is always safe.
CREATE OR REPLACE FUNCTION harvest_queue_pause(p_queue text, p_paused boolean, p_actor text,
                                               OUT changed boolean, OUT paused_at timestamptz, OUT paused_by text)
LANGUAGE plpgsql AS $$
DECLARE
    v_was boolean;
BEGIN
    v_was := harvest_queue_pause_lock(p_queue, true);
    IF p_paused THEN
        INSERT INTO queue_pauses (queue, paused_by) VALUES (p_queue, p_actor) ON CONFLICT (queue) DO NOTHING;
        SELECT p.paused_at, p.paused_by INTO paused_at, paused_by FROM queue_pauses p WHERE p.queue = p_queue;
    ELSE
        DELETE FROM queue_pauses p WHERE p.queue = p_queue;
    END IF;
    changed := v_was IS DISTINCT FROM p_paused;
    INSERT INTO audit (actor, action, queue, key, old_value, new_value, outcome, message)
    VALUES (p_actor, CASE WHEN p_paused THEN 'queue.pause' ELSE 'queue.resume' END, p_queue, NULL,
            jsonb_build_object('paused', v_was), jsonb_build_object('paused', p_paused), 'ok',
            CASE WHEN changed THEN '' WHEN p_paused THEN 'already paused' ELSE 'was not paused' END);
END
$$;
