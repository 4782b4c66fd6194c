-- Promote the due scheduled rows of one queue, as harvest_promote_due does,
-- but wait for rows another promoter (the janitor, or an ordinary claim of
-- the queue) holds instead of skipping them. A fair claim calls it under
-- the queue's exclusive lock: had it skipped the rows the janitor was
-- promoting, it would fold and charge only part of a set of co-due rows
-- and hand out a whole batch from that part. Nobody it waits for waits in
-- turn (the janitor and ordinary claims skip locked rows, and no other
-- fair claim of the queue runs meanwhile), so the wait cannot deadlock.
CREATE OR REPLACE FUNCTION harvest_promote_queue(p_queue text, p_now timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE tasks SET state = 'pending'
    WHERE id IN (SELECT x.id FROM tasks x
                 WHERE x.state = 'scheduled' AND x.queue = p_queue AND x.due_at <= coalesce(p_now, now())
                 ORDER BY x.due_at LIMIT p_limit FOR UPDATE);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
