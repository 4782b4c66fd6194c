-- The advisory lock key of a queue's fair lock: the one place that names
-- it, so that the exclusive holders (harvest_queue_lock) and the lone-key
-- batches that share it (harvest_queue_lock_shared) can never lock two
-- different keys and miss each other.
CREATE OR REPLACE FUNCTION harvest_queue_lock_key(p_queue text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('harvest.fair' || chr(1) || p_queue, 0)
$$;
