-- Take the fair lock of a queue in shared mode until the end of the
-- transaction, as lone-key batches do (harvest_claim_lone): any number of
-- them hold it together, and every exclusive holder (harvest_queue_lock)
-- waits for all of them, as they wait for it.
CREATE OR REPLACE FUNCTION harvest_queue_lock_shared(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(harvest_queue_lock_key(p_queue));
END
$$;
