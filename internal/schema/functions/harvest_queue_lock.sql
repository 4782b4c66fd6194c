-- Take the fair lock of a queue until the end of the transaction. Every
-- fair claim, the fold of new arrivals, the prune and the repair of the
-- queue's fairness state hold it, so they run one at a time and each sees
-- what the previous one committed: the claims of a queue follow the
-- reference model in the order they take this lock, whatever the number of
-- claimers. Starts never take it; ordinary claims of a queue with quotas take
-- it shared (harvest_claim_prepare).
CREATE OR REPLACE FUNCTION harvest_queue_lock(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(harvest_queue_lock_key(p_queue));
END
$$;
