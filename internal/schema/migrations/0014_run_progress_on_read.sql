-- A claim no longer writes its run (issue 35): it leases the task row and
-- reads what the worker needs of the run. What the claim used to write is
-- now either written when the attempt ends (the outcome, the rescue of an
-- expired lease, a cancel: attempts + 1 and the first claim time) or, while
-- the attempt is in flight, derived on read from the run's running task:
--
--   status      a run stored 'queued' with a running task reads 'running';
--   attempts    the stored attempts count the attempts that ended; the
--               attempts in flight (the run's running tasks) are added;
--   claimed_at  while no attempt has ended, the earliest claim of the
--               running tasks.
--
-- A continuation stores 'running' (the run reads running between its
-- steps, as before) and its attempt; the next step's claim writes nothing.
-- So stored 'running' now means "a step ended and the run went on", never
-- "an attempt is counted that has not ended", and the derivation adds the
-- attempts in flight to a run stored either 'queued' or 'running'. A final
-- run is read as stored: whatever made it final counted its attempts.
--
-- runs_seen is the one place this is written: every read a user or the
-- system sees (the gateway's and the console's reads and listings with
-- their status filters, the run's waiting reasons) reads runs_seen, never
-- runs, for these three columns. Its other columns are the run's own.
-- Writers and the claim keep reading runs.
--
-- The task lookup reads tasks_run_pk (a run's few tasks: one per step)
-- and is gated on the run being unfinished, so a listing of finished runs
-- reads no task. No index of its own: a partial index of the running
-- tasks by run would take one more B-tree entry on every claim (the
-- claim's update of a task is never HOT, its state changes), the hot path,
-- to save a few heap reads on the reads of runs, which are far rarer.

CREATE VIEW runs_seen AS
SELECT r.pk, r.tenant, r.id, r.name, r.queue, r.fairness_key, r.quota_key, r.priority, r.input,
       r.request_hash,
       CASE WHEN r.status = 'queued' AND f.running > 0 THEN 'running' ELSE r.status END AS status,
       r.attempts + f.running AS attempts,
       r.max_attempts, r.timeout_ms, r.output, r.error, r.created_at,
       coalesce(r.claimed_at, f.first_claimed_at) AS claimed_at,
       r.finished_at, r.not_before
FROM runs r
CROSS JOIN LATERAL (
    -- One row always (an aggregate): 0 and NULL for a run with no running
    -- task, and for a run not stored unfinished, which the planner checks
    -- before it reads any task (a one-time filter per run).
    SELECT count(*)::integer AS running, min(t.claimed_at) AS first_claimed_at
    FROM tasks t
    WHERE t.run_pk = r.pk AND t.state = 'running' AND r.status IN ('queued', 'running')
) f;

-- A rolling upgrade: runs claimed by the previous release's claim were
-- written 'running' with the attempt in flight counted already. Take that
-- attempt back out of the stored count, so that such a run reads as it
-- did (the derivation adds it again) and its outcome, which now counts
-- it, does not count it twice. The functions are replaced in this same
-- transaction, so a claim that starts after it commits writes no run. (A
-- claim already inside the previous release's function when this ran, and
-- committing after it, keeps the count it wrote: such a run's attempts
-- end one high. Stored 'running' rows are taken everywhere else: the
-- outcomes, the rescue and the cancel accept 'queued' and 'running'.)
UPDATE runs r SET attempts = greatest(r.attempts - f.n, 0)
FROM (SELECT t.run_pk, count(*)::integer AS n
      FROM tasks t WHERE t.state = 'running'
      GROUP BY t.run_pk) f
WHERE r.pk = f.run_pk AND r.status = 'running';
