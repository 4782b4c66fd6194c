-- The advisory lock key of a queue's fair lock: the one place that names
-- it, so that the exclusive holders (harvest_queue_lock) and the lone-key
-- batches that share it (harvest_queue_lock_shared) can never lock two
-- different keys and miss each other.
--
-- STABLE, though the value never changes: the planner runs an IMMUTABLE
-- function whose arguments are constants (as in each custom plan of its
-- callers) through the SQL-function executor, which parses and plans the
-- body at every such call; a STABLE one is inlined and its body folded.
CREATE OR REPLACE FUNCTION harvest_queue_lock_key(p_queue text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('harvest.fair' || chr(1) || p_queue, 0)
$$;
