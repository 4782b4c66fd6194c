-- Fail the attempt. With p_retry_at and attempts left, the task waits for
-- p_retry_at (pending or scheduled) and the run is queued again; otherwise
-- the run fails. Returns true when the task will run again. Fenced by the
-- lease token (HA001 when it is not current); what a failure does is
-- defined once, in harvest_outcome_batch.
CREATE OR REPLACE FUNCTION harvest_fail(p_id bigint, p_token uuid, p_error text, p_retry_at timestamptz, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    v_retried boolean;
BEGIN
    SELECT o.retried INTO v_retried
    FROM harvest_outcome_one('fail', p_id, p_token, NULL, p_error, p_retry_at, NULL, NULL, p_now) AS o;
    RETURN v_retried;
END
$$;
