-- The fairness modes of a queue (queue_fairness): configured is false for
-- a queue without a row, which is one-level and charged per claim.
CREATE OR REPLACE FUNCTION harvest_fair_mode(p_queue text, OUT configured boolean, OUT two_level boolean,
                                             OUT runtime boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT true, f.two_level, f.charge = 'runtime' INTO configured, two_level, runtime
    FROM queue_fairness f WHERE f.queue = p_queue;
    configured := coalesce(configured, false);
    two_level := coalesce(two_level, false);
    runtime := coalesce(runtime, false);
END
$$;
