-- Cancel the run p_id of p_tenant, in one statement (runstore.Cancel):
-- its unfinished tasks leave play, the run becomes cancelled with error
-- p_reason and the tenant's running count falls. The caller's transaction
-- is usually the statement's own, so the locks taken here (the run's
-- tasks, the run, the tenant's count row) are held until the commit and no
-- longer: a cancel made of separate statements held the count row across
-- several round trips to the gateway, and start groups, which wait for
-- that row while they hold the shard's admission lock, waited with it.
--
-- No row: no such run. Otherwise outcome says what happened:
--   cancelled  the run was not final when read, and is cancelled now
--              (was_running: a task of it was leased to a worker);
--   final      the run was final when read, or a worker finished it
--              between the read and the lock (nothing was changed then:
--              its tasks were done and the finish leaves a final run
--              alone).
-- The rest of the row is the run as runs_seen shows it after the cancel,
-- and notify, whether the run's end is announced on NATS (runs.notify:
-- the gateway announces the cancel only then).
-- A run waiting as a deferred start (no task yet) is cancelled as any run,
-- its slot released; package deferred sends such runs down its own path,
-- which also closes their group.
-- A move copying the run (move_out) raises HA021, which undoes the whole
-- statement: the caller sends the cancel again, to the run's new home.
--
-- Locks are taken as the separate statements took them: the run is read
-- without a lock, then its tasks are locked (task first, run second, the
-- order of the claim and of the outcome batch), then the run's row by its
-- update, then the count row (harvest_run_finish).
DROP FUNCTION IF EXISTS harvest_run_cancel(text, text, text);
CREATE OR REPLACE FUNCTION harvest_run_cancel(p_tenant text, p_id text, p_reason text)
RETURNS TABLE (outcome text, was_running boolean,
               pk bigint, id text, tenant text, name text, queue text, fairness_key text, quota_key text,
               priority integer, status text, attempts integer, created_at timestamptz,
               claimed_at timestamptz, finished_at timestamptz, output jsonb, error text, request_hash bytea,
               notify boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_pk      bigint;
    v_before  text;
    v_running integer := 0;
    v_first   timestamptz;
    v_n       integer;
    v_at      timestamptz;
BEGIN
    SELECT r.pk, r.status INTO v_pk, v_before FROM runs r WHERE r.tenant = p_tenant AND r.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_before NOT IN ('completed', 'failed', 'cancelled') THEN
        -- Two passes: a continuation committed while the first one waited
        -- for a task's lock is seen by the second (each statement takes a
        -- new snapshot) and taken out too, with its attempt if a worker
        -- claimed it meanwhile. A later continuation needs the old lease,
        -- which is void by then.
        FOR i IN 1..2 LOOP
            WITH t AS (
                SELECT x.id, x.state FROM tasks x
                WHERE x.run_pk = v_pk AND x.state <> 'done'
                FOR UPDATE
            ), u AS (
                UPDATE tasks x
                SET state = 'done', lease_token = NULL, lease_expires_at = NULL
                FROM t
                WHERE x.id = t.id
                RETURNING t.state AS was, x.claimed_at
            )
            SELECT count(*) FILTER (WHERE u.was = 'running'),
                   min(u.claimed_at) FILTER (WHERE u.was = 'running')
            INTO v_n, v_at
            FROM u;
            v_running := v_running + v_n;
            IF v_at IS NOT NULL AND (v_first IS NULL OR v_at < v_first) THEN
                v_first := v_at;
            END IF;
        END LOOP;
        -- The attempts taken out end with the run: the claim did not count
        -- them, so the cancel does.
        PERFORM harvest_run_finish(v_pk, 'cancelled', NULL, p_reason, v_running, v_first);
        -- The finish holds the run's row, which a move takes before it
        -- copies the run: a move that got there first shows here.
        IF EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = v_pk) THEN
            RAISE EXCEPTION 'harvest_run_cancel: run % of tenant % is being moved', p_id, p_tenant
                USING ERRCODE = 'HA021';
        END IF;
    END IF;
    RETURN QUERY
        SELECT CASE WHEN v_before NOT IN ('completed', 'failed', 'cancelled') AND s.status = 'cancelled'
                    THEN 'cancelled' ELSE 'final' END,
               v_running > 0,
               s.pk, s.id, s.tenant, s.name, s.queue, s.fairness_key, s.quota_key, s.priority, s.status,
               s.attempts, s.created_at, s.claimed_at, s.finished_at, s.output, s.error, s.request_hash,
               (SELECT n.notify FROM runs n WHERE n.pk = s.pk)
        FROM runs_seen s
        WHERE s.tenant = p_tenant AND s.id = p_id;
END
$$;
