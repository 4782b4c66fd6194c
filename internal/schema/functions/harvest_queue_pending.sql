-- Whether p_queue has a pending row, read as one entry of the pending
-- order index, so that no plan can answer it by reading the table. As a
-- plain EXISTS it could: statistics taken while a flood was pending make a
-- sequential scan look cheapest, and once the flood has been claimed from
-- the front of the heap that scan reads every row left behind before the
-- few still pending (a start into the queue paid tens of milliseconds for
-- it). The index is read from its last entry backwards, because claims
-- take rows from the front: the entries of rows claimed since the last
-- vacuum lie there, and a probe from the front steps over all of them.
-- PL/pgSQL so that the plan is kept from one call to the next.
CREATE OR REPLACE FUNCTION harvest_queue_pending(p_queue text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tasks x
    WHERE x.queue = p_queue AND x.state = 'pending'
    ORDER BY x.priority, x.continuation, x.due_at DESC, x.id DESC
    LIMIT 1;
    RETURN FOUND;
END
$$;
