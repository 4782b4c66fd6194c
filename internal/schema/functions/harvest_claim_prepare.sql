-- What a claim statement does once, before its steps (the entry points
-- harvest_claim and harvest_claim_batch; the caller has taken the queue's
-- pause lock). A fair claim takes the queue's fair lock (held to the
-- commit, so the fair claims of a queue run one after the other, each
-- against what the previous committed), turns synchronous_commit off for
-- its transaction when p_release_early (see harvest_claim), promotes the
-- queue's due scheduled rows waiting for rows another promoter holds
-- (harvest_promote_queue), folds the arrivals into the key heads
-- (harvest_fair_fold), and, in a queue with fairness modes, the worker
-- time of ended attempts (harvest_fair_held_fold). An ordinary claim only
-- promotes, skipping rows another promoter holds (harvest_promote_due).
-- Returns the queue's modes as read under the fair lock (a change of modes
-- waits for the lock); both false for an ordinary claim.
CREATE OR REPLACE FUNCTION harvest_claim_prepare(p_queue text, p_now timestamptz, p_fair boolean,
                                                 p_release_early boolean,
                                                 OUT two_level boolean, OUT runtime boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_conf boolean;
BEGIN
    two_level := false;
    runtime := false;
    IF NOT p_fair THEN
        PERFORM harvest_promote_due(p_queue, coalesce(p_now, now()), 1000);
        RETURN;
    END IF;
    PERFORM harvest_queue_lock(p_queue);
    IF p_release_early THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM harvest_promote_queue(p_queue, coalesce(p_now, now()), 1000);
    PERFORM harvest_fair_fold(p_queue);
    SELECT m.configured, m.two_level, m.runtime INTO v_conf, two_level, runtime FROM harvest_fair_mode(p_queue) m;
    IF v_conf THEN
        PERFORM harvest_fair_held_fold(p_queue, two_level);
    END IF;
END
$$;
