-- Put back tasks whose lease expired (database clock), or fail their run
-- when it has used its attempts. A task finished meanwhile is not running
-- any more and is never touched.
--
-- The expired attempt ends here, so it is counted in its run as an
-- outcome counts it (the claim wrote nothing to the run): attempts + 1,
-- and the task's claim time as the run's first when it has none. A run
-- put back is stored 'queued': it was stored 'queued' (its first step, or
-- a retry) or 'running' (a later step of a continued run, or a run a claim
-- of the previous release marked running during a rolling upgrade), and
-- reads queued either way once its task is pending again.
--
-- The expired leases are found among the running tasks (the partial index
-- tasks_running, bounded by the fleet's slots), by their expiry on the
-- row: the expiry itself is not indexed, so that a heartbeat writes no
-- index entry (migration 0011). A task whose lease is live, or that a
-- worker is recording (locked), is skipped.
--
-- Locks are taken as a completion batch takes them: the tasks, then the
-- runs this pass fails, then their tenants' count rows in byte order
-- (COLLATE "C", see runstore's TenantRunningLock). Failing the runs one by
-- one would take tenant rows in lease order, which a start group holding
-- two of the same tenants in the other order would deadlock with.
CREATE OR REPLACE FUNCTION harvest_rescue_expired(p_limit integer, OUT rescued integer, OUT failed integer)
LANGUAGE plpgsql
-- No sequential scans (and so no JIT, which a plan costed with them ruled
-- out could tempt): the janitor's connection keeps its plans, and those
-- made on a small shard read the whole of tasks and of runs for every
-- lease rescued once the shard had grown (TestHeartbeatAndRescuePlansOutliveTheShardsGrowth).
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    v_ids  bigint[];
    r_task record;
BEGIN
    rescued := 0;
    failed := 0;
    SELECT array_agg(e.id ORDER BY e.lease_expires_at) INTO v_ids
    FROM (SELECT t.id, t.lease_expires_at FROM tasks t
          WHERE t.state = 'running' AND t.lease_expires_at < now()
          ORDER BY t.lease_expires_at
          LIMIT p_limit
          FOR UPDATE SKIP LOCKED) AS e;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- The runs (each is written below: its attempt counted, or failed),
    -- then the tenants' rows of those that have used their attempts.
    -- Every read below goes by key: the runs by an array of their keys,
    -- each task's run by a probe of its own (OFFSET 0 keeps it apart); as
    -- joins, the plans cached on a small shard merged the leases with a
    -- scan of the whole primary key.
    PERFORM 1 FROM runs r
    WHERE r.pk = ANY (ARRAY(SELECT t.run_pk FROM tasks t WHERE t.id = ANY (v_ids)))
    ORDER BY r.pk FOR UPDATE;
    -- (The count rows in byte order and the shard's count stripes they
    -- fall into, ascending: harvest_running_lock.)
    PERFORM harvest_running_lock(ARRAY(
        SELECT r.tenant FROM tasks t
        CROSS JOIN LATERAL (SELECT r0.tenant, r0.max_attempts, r0.status FROM runs r0
                            WHERE r0.pk = t.run_pk OFFSET 0) r
        WHERE t.id = ANY (v_ids) AND t.attempt >= r.max_attempts
          AND r.status NOT IN ('completed', 'failed', 'cancelled')));
    FOR r_task IN
        SELECT t.id, t.run_pk, t.attempt, t.claimed_at, r.max_attempts
        FROM tasks t
        LEFT JOIN LATERAL (SELECT r0.max_attempts FROM runs r0 WHERE r0.pk = t.run_pk OFFSET 0) r ON true
        WHERE t.id = ANY (v_ids)
        ORDER BY t.lease_expires_at
    LOOP
        IF r_task.attempt >= coalesce(r_task.max_attempts, 1) THEN
            UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = r_task.id;
            PERFORM harvest_run_finish(r_task.run_pk, 'failed', NULL,
                format('lease expired on attempt %s of %s', r_task.attempt, r_task.max_attempts),
                1, r_task.claimed_at);
            failed := failed + 1;
        ELSE
            UPDATE tasks SET state = 'pending', lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
            WHERE id = r_task.id;
            UPDATE runs SET status = 'queued', attempts = attempts + 1,
                            claimed_at = coalesce(claimed_at, r_task.claimed_at)
            WHERE pk = r_task.run_pk AND status IN ('queued', 'running');
            rescued := rescued + 1;
        END IF;
    END LOOP;
END
$$;
