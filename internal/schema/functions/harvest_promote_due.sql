-- Promote scheduled rows that are due (of one queue, or of all when p_queue
-- is NULL), at most p_limit of them, skipping rows another promoter holds.
-- Each promoted row is announced to the fair claimers (tasks_arrive).
CREATE OR REPLACE FUNCTION harvest_promote_due(p_queue text, p_now timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql
-- The due rows by tasks_scheduled_due and their update by id, whatever the
-- statistics the cached plan was made with (see harvest_claim_batch).
SET enable_seqscan = off
AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_queue IS NULL THEN
        UPDATE tasks SET state = 'pending'
        WHERE id IN (SELECT x.id FROM tasks x
                     WHERE x.state = 'scheduled' AND x.due_at <= coalesce(p_now, now())
                     ORDER BY x.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    ELSE
        UPDATE tasks SET state = 'pending'
        WHERE id IN (SELECT x.id FROM tasks x
                     WHERE x.state = 'scheduled' AND x.queue = p_queue AND x.due_at <= coalesce(p_now, now())
                     ORDER BY x.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
