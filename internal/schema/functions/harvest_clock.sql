-- The queue clock V: the largest last_start of the queue (0 without rows).
CREATE OR REPLACE FUNCTION harvest_clock(p_queue text) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT last_start FROM fair_state
                     WHERE queue = p_queue AND charged_at IS NOT NULL
                     ORDER BY last_start DESC LIMIT 1), 0)
$$;
