-- The queue clock V: the largest last_start of the queue's keys (0 for a
-- queue without fairness state).
CREATE OR REPLACE FUNCTION harvest_clock(p_queue text) RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_clock double precision;
BEGIN
    SELECT clock INTO v_clock FROM fair_queues WHERE queue = p_queue;
    RETURN coalesce(v_clock, 0);
END
$$;
