-- Complete a leased task: the task is done and its run completed, fenced
-- by the lease token (HA001 when it is not current). What a completion
-- does is defined once, in harvest_outcome_batch.
CREATE OR REPLACE FUNCTION harvest_complete(p_id bigint, p_token uuid, p_output jsonb) RETURNS void
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
BEGIN
    PERFORM harvest_outcome_one('complete', p_id, p_token, p_output, NULL, NULL, NULL, NULL, NULL);
END
$$;
