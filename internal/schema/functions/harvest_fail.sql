-- Fail the attempt. With p_retry_at and attempts left, the task waits for
-- p_retry_at (pending or scheduled) and the run is queued again; otherwise
-- the run fails. Returns true when the task will run again.
CREATE OR REPLACE FUNCTION harvest_fail(p_id bigint, p_token uuid, p_error text, p_retry_at timestamptz, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_max  integer;
BEGIN
    SELECT max_attempts INTO v_max FROM runs WHERE pk = r_task.run_pk;
    IF p_retry_at IS NOT NULL AND r_task.attempt < coalesce(v_max, 1) THEN
        UPDATE tasks SET
            state = CASE WHEN p_retry_at <= coalesce(p_now, now()) THEN 'pending' ELSE 'scheduled' END,
            due_at = p_retry_at, lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
        WHERE id = p_id;
        UPDATE runs SET status = 'queued', error = p_error
        WHERE pk = r_task.run_pk AND status = 'running';
        RETURN true;
    END IF;
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    PERFORM harvest_run_finish(r_task.run_pk, 'failed', NULL, p_error);
    RETURN false;
END
$$;
