-- Take the queue's turn among override writers; returns the current count.
CREATE OR REPLACE FUNCTION harvest_weight_lock(p_queue text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    INSERT INTO weight_override_counts (queue, n) VALUES (p_queue, 0)
    ON CONFLICT (queue) DO NOTHING;
    SELECT n INTO v_n FROM weight_override_counts WHERE queue = p_queue FOR UPDATE;
    RETURN v_n;
END
$$;
