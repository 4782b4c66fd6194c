-- The dispatch claim's pick (claim.ClaimByID): the named row only, if it is
-- still pending in the queue and due, locked unless another claimer holds
-- it. harvest_claim_step tries no other pick for it.
CREATE OR REPLACE FUNCTION harvest_pick_named(p_queue text, p_task_id bigint, p_due_cut timestamptz) RETURNS tasks
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
BEGIN
    SELECT * INTO r_task FROM tasks x
    WHERE x.id = p_task_id AND x.queue = p_queue AND x.state = 'pending' AND x.due_at <= p_due_cut
    FOR UPDATE SKIP LOCKED;
    RETURN r_task;
END
$$;
