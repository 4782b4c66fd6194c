-- The first pending row of a key, read from the key's index starting at a
-- known earlier head (p_*): no pending row of the key comes before that
-- head, so the search seeks past the index entries of rows claimed since
-- the last vacuum instead of stepping over them one by one (they are what
-- made a long drain slow down as it went). When the head's group
-- (priority, continuation) has no pending row left, or no head is known,
-- the whole key is searched in order.
CREATE OR REPLACE FUNCTION harvest_key_head(p_queue text, p_key text, p_prio integer, p_cont boolean,
                                            p_due timestamptz, p_id bigint,
                                            OUT head_id bigint, OUT head_prio integer, OUT head_cont boolean,
                                            OUT head_due timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_id IS NOT NULL THEN
        SELECT x.id, x.priority, x.continuation, x.due_at INTO head_id, head_prio, head_cont, head_due
        FROM tasks x
        WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
          AND x.priority = p_prio AND x.continuation = p_cont AND (x.due_at, x.id) >= (p_due, p_id)
        ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
        LIMIT 1;
        IF head_id IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    SELECT x.id, x.priority, x.continuation, x.due_at INTO head_id, head_prio, head_cont, head_due
    FROM tasks x
    WHERE x.queue = p_queue AND x.fairness_key = p_key AND x.state = 'pending'
    ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
    LIMIT 1;
END
$$;
