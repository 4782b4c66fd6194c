-- The task under lease, locked, or an error when the token is not current.
-- Error codes (class HA is Harvest's own, not used by PostgreSQL): HA001
-- the lease token is not the task's current one, HA002 no such task;
-- pkg/claim maps them to its sentinel errors.
CREATE OR REPLACE FUNCTION harvest_leased(p_id bigint, p_token uuid) RETURNS tasks
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
BEGIN
    SELECT * INTO r_task FROM tasks WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % not found', p_id USING ERRCODE = 'HA002';
    END IF;
    IF r_task.state <> 'running' OR r_task.lease_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'task %: lease token is not current', p_id USING ERRCODE = 'HA001';
    END IF;
    RETURN r_task;
END
$$;
