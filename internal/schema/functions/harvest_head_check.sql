-- Take the head of the key a fair pick chose (p_head: the key's fair_state
-- row as the pick read it, under the queue's fair lock), or repair it.
-- After the fold no pending row of a key comes before its head, so a head
-- still pending where the summary says is the key's first row: it is
-- locked, waiting for a short holder (a cancel, an ordinary claim), and
-- returned. A head that left the pending state or moved meanwhile (an
-- ordinary claim, a cancel, an update took it) is replaced by the key's
-- true first row (harvest_head_repair), and the result is NULL: the caller
-- compares the keys again. Both picks by key heads use it
-- (harvest_pick_fair_heads, harvest_pick_group_heads).
CREATE OR REPLACE FUNCTION harvest_head_check(p_queue text, p_head fair_state) RETURNS tasks
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
BEGIN
    SELECT * INTO r_task FROM tasks x
    WHERE x.id = p_head.head_id AND x.state = 'pending' AND x.queue = p_queue
      AND x.fairness_key = p_head.key AND x.priority = p_head.head_prio
      AND x.continuation = p_head.head_cont AND x.due_at = p_head.head_due
    FOR UPDATE;
    IF r_task.id IS NULL THEN
        PERFORM harvest_head_repair(p_queue, p_head);
    END IF;
    RETURN r_task;
END
$$;
