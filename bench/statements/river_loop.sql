-- The same loop on River: its fetch (JobGetAvailable) and its batch
-- completer's statement (JobSetStateIfRunningMany), as riverpgxv5 v0.51.2
-- sends them (riverdriver/riverpgxv5/internal/dbsqlc/river_job.sql,
-- MPL-2.0), with the parameters a client of the default queue passes. Two
-- changes of form only: the fetch's rows are gathered by a CTE instead of
-- being sent to the client, and the completer's answer is counted. Each
-- statement commits on its own, as River's do; run.sh sets
-- synchronous_commit.
DO $$
DECLARE
    v_batch int := current_setting('harvest_bench.batch')::int;
    v_stop  int := current_setting('harvest_bench.rows')::int / 2;
    v_ids   bigint[];
    v_n     int;
    v_x     int;
    v_done  int := 0;
    v_claim interval := '0';
    v_t     timestamptz;
    v_t0    timestamptz := clock_timestamp();
BEGIN
    WHILE v_done < v_stop LOOP
        v_t := clock_timestamp();
        WITH locked_jobs AS (
            SELECT id, args, attempt, attempted_at, attempted_by, created_at, errors, finalized_at, kind,
                   max_attempts, metadata, priority, queue, state, scheduled_at, tags, unique_key, unique_states
            FROM river_job
            WHERE state = 'available' AND queue = 'default'
              AND (NULL::text[] IS NULL OR kind = ANY (NULL::text[]))
              AND scheduled_at <= coalesce(NULL::timestamptz, now())
            ORDER BY priority ASC, scheduled_at ASC, id ASC
            LIMIT v_batch
            FOR UPDATE SKIP LOCKED
        ), fetched AS (
            UPDATE river_job SET
                state = 'running',
                attempt = river_job.attempt + 1,
                attempted_at = coalesce(NULL::timestamptz, now()),
                attempted_by = array_append(
                    CASE WHEN array_length(river_job.attempted_by, 1) >= 100
                         THEN river_job.attempted_by[array_length(river_job.attempted_by, 1) + 2 - 100:]
                         ELSE river_job.attempted_by END,
                    'w'::text)
            FROM locked_jobs
            WHERE river_job.id = locked_jobs.id
            RETURNING river_job.*
        )
        SELECT array_agg(id ORDER BY id) INTO v_ids FROM fetched;
        COMMIT;
        v_claim := v_claim + (clock_timestamp() - v_t);
        v_n := coalesce(cardinality(v_ids), 0);
        EXIT WHEN v_n = 0;
        WITH job_input AS (
            SELECT unnest(v_ids) AS id,
                   unnest(array_fill(false, ARRAY[v_n])) AS attempt_do_update,
                   unnest(array_fill(0, ARRAY[v_n])) AS attempt,
                   unnest(array_fill(false, ARRAY[v_n])) AS errors_do_update,
                   unnest(array_fill(NULL::jsonb, ARRAY[v_n])) AS errors,
                   unnest(array_fill(true, ARRAY[v_n])) AS finalized_at_do_update,
                   unnest(array_fill(now(), ARRAY[v_n])) AS finalized_at,
                   unnest(array_fill(false, ARRAY[v_n])) AS metadata_do_merge,
                   unnest(array_fill(NULL::jsonb, ARRAY[v_n])) AS metadata_updates,
                   unnest(array_fill(false, ARRAY[v_n])) AS scheduled_at_do_update,
                   unnest(array_fill(NULL::timestamptz, ARRAY[v_n])) AS scheduled_at,
                   unnest(array_fill('completed'::text, ARRAY[v_n]))::river_job_state AS state
        ), updated AS (
            UPDATE river_job SET
                attempt = CASE WHEN river_job.state = 'running'
                                    AND NOT (job_input.state IN ('available', 'retryable', 'scheduled')
                                             AND river_job.metadata ? 'cancel_attempted_at')
                                    AND job_input.attempt_do_update
                               THEN job_input.attempt ELSE river_job.attempt END,
                errors = CASE WHEN river_job.state = 'running' AND job_input.errors_do_update
                              THEN array_append(river_job.errors, job_input.errors) ELSE river_job.errors END,
                finalized_at = CASE WHEN river_job.state = 'running'
                                         AND (job_input.state IN ('available', 'retryable', 'scheduled')
                                              AND river_job.metadata ? 'cancel_attempted_at')
                                    THEN now()
                                    WHEN river_job.state = 'running' AND job_input.finalized_at_do_update
                                    THEN job_input.finalized_at
                                    ELSE river_job.finalized_at END,
                metadata = CASE WHEN job_input.metadata_do_merge
                                THEN river_job.metadata || job_input.metadata_updates ELSE river_job.metadata END,
                scheduled_at = CASE WHEN river_job.state = 'running'
                                         AND NOT (job_input.state IN ('available', 'retryable', 'scheduled')
                                                  AND river_job.metadata ? 'cancel_attempted_at')
                                         AND job_input.scheduled_at_do_update
                                    THEN job_input.scheduled_at ELSE river_job.scheduled_at END,
                state = CASE WHEN river_job.state = 'running'
                                  AND (job_input.state IN ('available', 'retryable', 'scheduled')
                                       AND river_job.metadata ? 'cancel_attempted_at')
                             THEN 'cancelled'::river_job_state
                             WHEN river_job.state = 'running' THEN job_input.state
                             ELSE river_job.state END
            FROM job_input
            WHERE river_job.id = job_input.id
              AND (river_job.state = 'running' OR job_input.metadata_do_merge)
            RETURNING river_job.*
        )
        SELECT count(*) INTO v_x FROM (
            SELECT river_job.id FROM river_job JOIN job_input ON river_job.id = job_input.id
            WHERE NOT EXISTS (SELECT 1 FROM updated WHERE updated.id = river_job.id)
            UNION ALL
            SELECT id FROM updated) s;
        COMMIT;
        v_done := v_done + v_n;
    END LOOP;
    RAISE NOTICE 'river: % tasks, % us a task, of which the claim %', v_done,
        round((extract(epoch FROM clock_timestamp() - v_t0) * 1e6 / v_done)::numeric, 1),
        round((extract(epoch FROM v_claim) * 1e6 / v_done)::numeric, 1);
END $$;
