-- Whether a row pinned to worker p_worker (sticky_worker, pin still
-- running at p_now) waits in p_queue, due by p_due_cut. The single claim
-- takes such rows before any other (harvest_pick_sticky), and the bulk
-- and lone steps know nothing of pins, so a batch asks this before each
-- bulk step and before the lone path, and the step before its sticky pick
-- (the probe of the partial index tasks_pending_sticky is cheaper than the
-- pick's call). An unnamed worker has no pinned rows.
--
-- plpgsql, not sql: the planner never inlines an SQL function whose body
-- holds a subquery (the EXISTS), so as LANGUAGE sql every call site parsed
-- and planned the body again in each transaction (about 0.14 ms, several
-- times per claim statement, under the queue's fair lock); plpgsql keeps
-- the probe's plan for the session.
CREATE OR REPLACE FUNCTION harvest_pinned_waiting(p_queue text, p_worker text, p_now timestamptz,
                                                  p_due_cut timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN p_worker <> '' AND EXISTS (
        SELECT 1 FROM tasks x
        WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
          AND x.sticky_until > p_now AND x.due_at <= p_due_cut);
END
$$;
