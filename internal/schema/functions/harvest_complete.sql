-- Complete a leased task: the task is done and its run completed, fenced
-- by the lease token (HA001 when it is not current).
CREATE OR REPLACE FUNCTION harvest_complete(p_id bigint, p_token uuid, p_output jsonb) RETURNS void
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
BEGIN
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    PERFORM harvest_run_finish(r_task.run_pk, 'completed', p_output, NULL);
END
$$;
