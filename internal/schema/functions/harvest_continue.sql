-- Finish this task and enqueue the run's next one in the continuation band,
-- same queue and keys; optionally pinned to the worker that holds the lease
-- until p_sticky_until, and due at p_due. Returns the new task's id. The
-- step's attempt is counted in the run, which stays running between its
-- steps (the claim of the next step writes no run). Fenced by the lease
-- token (HA001 when it is not current); what a continuation does is
-- defined once, in harvest_outcome_batch.
CREATE OR REPLACE FUNCTION harvest_continue(p_id bigint, p_token uuid, p_input jsonb, p_sticky_until timestamptz,
                                 p_due timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT o.next_id INTO v_id
    FROM harvest_outcome_one('continue', p_id, p_token, p_input, NULL, NULL, p_due, p_sticky_until, p_now) AS o;
    RETURN v_id;
END
$$;
