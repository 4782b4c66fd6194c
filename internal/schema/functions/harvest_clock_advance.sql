-- Move a queue's clock V forward to p_clock (never back: lone-key batches
-- charge side by side and may commit out of order) and clear the debt mark
-- of every key the clock reached, so that in_debt stays exactly pass > V.
-- Callers call it only when a charge's start moved past the clock they
-- read, and hold the queue's fair lock (exclusive, or shared with the
-- queue's only key's state row locked).
CREATE OR REPLACE FUNCTION harvest_clock_advance(p_queue text, p_clock double precision) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_queues AS q (queue, clock) VALUES (p_queue, p_clock)
    ON CONFLICT (queue) DO UPDATE SET clock = greatest(q.clock, excluded.clock);
    UPDATE fair_state SET in_debt = false
    WHERE queue = p_queue AND in_debt AND pass <= p_clock;
END
$$;
