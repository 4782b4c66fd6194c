-- Whether a row pinned to worker p_worker (sticky_worker, pin still
-- running at p_now) waits in p_queue, due by p_due_cut. The single claim
-- takes such rows before any other (harvest_pick_sticky), and the bulk
-- and lone steps know nothing of pins, so a batch asks this before each
-- bulk step and before the lone path, and the step before its sticky pick
-- (the probe of the partial index tasks_pending_sticky is cheaper than the
-- pick's call). An unnamed worker has no pinned rows.
--
-- LANGUAGE sql, STABLE, one SELECT and no SET clause: the planner inlines
-- it into the caller's expression.
CREATE OR REPLACE FUNCTION harvest_pinned_waiting(p_queue text, p_worker text, p_now timestamptz,
                                                  p_due_cut timestamptz)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_worker <> '' AND EXISTS (
        SELECT 1 FROM tasks x
        WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
          AND x.sticky_until > p_now AND x.due_at <= p_due_cut)
$$;
