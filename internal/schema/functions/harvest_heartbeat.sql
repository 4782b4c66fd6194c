-- Extend a lease by p_extend from now (database clock), fenced by the
-- lease token. Returns the new expiry.
CREATE OR REPLACE FUNCTION harvest_heartbeat(p_id bigint, p_token uuid, p_extend interval) RETURNS timestamptz
LANGUAGE plpgsql
-- No JIT and no sequential scans: see harvest_claim_batch and
-- harvest_heartbeat_many.
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_until timestamptz;
BEGIN
    UPDATE tasks SET lease_expires_at = now() + p_extend WHERE id = r_task.id
    RETURNING lease_expires_at INTO v_until;
    RETURN v_until;
END
$$;
