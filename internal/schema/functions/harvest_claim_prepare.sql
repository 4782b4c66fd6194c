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
--
-- In a queue with quotas an ordinary claim takes the fair lock in shared
-- mode first (ordinary claims still run side by side; a fair claim waits
-- for them and they for it). The lock cycle this prevents: a fair claim
-- waits for the pending rows it picks (it may not skip one) while it holds
-- the quota rows of its earlier rows (an earlier step of its batch, or a
-- refusal), and an ordinary claim waits for a quota row while it holds
-- rows (its pick, its batch's earlier steps): each waited for the other
-- (TestFairAndOrdinaryClaimsInTurnDoNotDeadlockOnAQuota). Ordinary claims
-- never wait for a task row (their picks skip held rows), so with no fair
-- claim beside them no cycle goes through a task row. A quota created
-- while an ordinary claim runs that did not see it is the one gap: that
-- claim runs without the lock.
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
        -- In a queue with quotas the ordinary claims hold the fair lock
        -- shared, so none runs beside a fair claim (see above).
        IF EXISTS (SELECT 1 FROM quotas q WHERE q.queue = p_queue) THEN
            PERFORM harvest_queue_lock_shared(p_queue);
        END IF;
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
