-- Put back tasks whose lease expired (database clock), or fail their run
-- when it has used its attempts. A task finished meanwhile is not running
-- any more and is never touched.
CREATE OR REPLACE FUNCTION harvest_rescue_expired(p_limit integer, OUT rescued integer, OUT failed integer)
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
    v_max  integer;
BEGIN
    rescued := 0;
    failed := 0;
    FOR r_task IN
        SELECT * FROM tasks
        WHERE state = 'running' AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        SELECT max_attempts INTO v_max FROM runs WHERE pk = r_task.run_pk;
        IF r_task.attempt >= coalesce(v_max, 1) THEN
            UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = r_task.id;
            PERFORM harvest_run_finish(r_task.run_pk, 'failed', NULL,
                format('lease expired on attempt %s of %s', r_task.attempt, v_max));
            failed := failed + 1;
        ELSE
            UPDATE tasks SET state = 'pending', lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
            WHERE id = r_task.id;
            UPDATE runs SET status = 'queued' WHERE pk = r_task.run_pk AND status = 'running';
            rescued := rescued + 1;
        END IF;
    END LOOP;
END
$$;
