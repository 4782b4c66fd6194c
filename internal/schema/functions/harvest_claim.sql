-- One claim from one queue: claim.Claim and claim.ClaimByID.
--   p_now NULL: the database clock. Leases always use the database clock.
--   p_task_id: claim that row only (dispatch channel).
--   p_release_early: for a fair claim in a transaction of its own, commit
--   without waiting for the WAL flush, so the queue's fair lock is free as
--   soon as the commit record is written instead of after the flush. The
--   caller must then wait for a flush before it acts on the task (claim.Claim
--   sends one in the same round trip; the claim marks the session with
--   harvest.flush when it took a task). Any transaction that saw this claim
--   and commits later flushes it first, so nothing that depends on it can
--   outlive a crash that loses it.
-- A fair claim takes the queue's fair lock first, so the fair claims of a
-- queue run one after the other, each against what the previous committed
-- (harvest_claim_prepare: the lock, promotion, the fold); then one step
-- (harvest_claim_step).
CREATE OR REPLACE FUNCTION harvest_claim(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                         p_aging integer, p_lease interval, p_task_id bigint,
                                         p_release_early boolean)
RETURNS harvest_claimed
LANGUAGE plpgsql
-- No JIT and no sequential scans: see harvest_claim_batch.
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    r_out  harvest_claimed;
    r_mode record;
BEGIN
    -- A paused queue hands out nothing (queue_pauses); its shared pause
    -- lock comes before every other lock of the claim.
    IF harvest_queue_pause_lock(p_queue, false) THEN
        r_out.outcome := 'no_task';
        RETURN r_out;
    END IF;
    r_mode := harvest_claim_prepare(p_queue, p_now, p_fair, p_release_early);
    r_out := harvest_claim_step(p_queue, p_worker, p_now, p_fair, p_aging, p_lease, p_task_id,
                                r_mode.two_level, r_mode.runtime);
    IF p_fair AND p_release_early AND r_out.outcome = 'ok' THEN
        PERFORM set_config('harvest.flush', 'on', false);
    END IF;
    RETURN r_out;
END
$$;
