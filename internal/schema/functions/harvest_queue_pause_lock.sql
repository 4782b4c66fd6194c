-- The pause lock of a queue, until the end of the transaction: shared by
-- every claim of the queue (p_exclusive false), exclusive for the writer
-- of a pause or a resume. A pause therefore commits only once the claims
-- that were already running have ended, and every later claim reads it.
-- The key lives in its own namespace, apart from the fair lock's.
CREATE OR REPLACE FUNCTION harvest_queue_pause_lock(p_queue text, p_exclusive boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('harvest.pause' || chr(1) || p_queue, 0));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('harvest.pause' || chr(1) || p_queue, 0));
    END IF;
    RETURN EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = p_queue);
END
$$;
