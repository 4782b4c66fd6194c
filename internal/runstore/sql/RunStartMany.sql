-- Start a group of runs in one statement: RunStart for many starts at once,
-- which spares a statement, a savepoint and a trigger round per start. The
-- caller sends each (tenant, id) once per statement. A start whose id
-- exists gets no row back; the caller reads the existing run for it.
--
-- Every array holds one element per start, in the order the starts are to
-- be written. A row comes back for each new run, in no particular order:
-- its tenant and id, its pk, its task, whether the task is due now, whether
-- the task's queue had pending work before the statement, the tenant's
-- count after the statement (with its runs still on the old home while it
-- moves here, tenant_away), the shard's count before it, the database
-- clock (the run's created_at), the shard's capacity lease
-- (harvest_shard_lease), and, for a tenant with a start not due yet in
-- the group, its runs not due yet after the statement (else 0). A run not
-- due at its start keeps its due time in runs.not_before, which is what
-- that count reads (runs_not_due). The other columns of the run are those of
-- the request. The caller derives from the counts what each start would
-- have seen had the starts run one after the other (settleStarted).
--
-- $1 tenants, $2 ids, $3 names, $4 queues, $5 fairness keys, $6 quota keys,
-- $7 priorities, $8 inputs (JSON text), $9 request hashes, $10 max attempts,
-- $11 timeouts ms, $12 run_at, $13 delays in microseconds, $14 trace
-- contexts (JSON text).
--
-- $15 tenants and $16 counts, $17 a shard count, $18 whether the lease
-- binds: the admission guard (runstore.Guard). When $17 is not NULL the
-- statement fails with HA010 unless, after it, the shard's count is at
-- most $17 (and at most its lease when $18 is true) and each tenant of $15
-- holds at most its count of $16, so that the caller may commit without
-- asking about each start. NULL: no guard.
WITH input AS (
    SELECT i.*,
           coalesce(i.run_at, CASE WHEN i.delay_us > 0 THEN now() + i.delay_us * interval '1 microsecond' END,
                    now()) AS due_at
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::integer[],
                $8::text[], $9::bytea[], $10::integer[], $11::bigint[], $12::timestamptz[], $13::bigint[],
                $14::text[])
         WITH ORDINALITY AS i (tenant, id, name, queue, fkey, qkey, priority, input, hash,
                               max_attempts, timeout_ms, run_at, delay_us, trace, ord)
), run AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                      request_hash, max_attempts, timeout_ms, not_before)
    SELECT tenant, id, name, queue, fkey, qkey, priority, input::jsonb, hash, max_attempts, timeout_ms,
           CASE WHEN due_at > now() THEN due_at END
    FROM input
    -- HA020 when a tenant of the group has moved away (tenant_fences).
    WHERE harvest_tenant_fence($1::text[])
    ORDER BY ord
    ON CONFLICT (tenant, id) DO NOTHING
    RETURNING pk, tenant, id
), task AS (
    -- The rows harvest_enqueue would write, without a call per row.
    INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                       step, input, trace_context)
    SELECT run.pk, i.queue, i.fkey, i.qkey, i.priority, false,
           CASE WHEN i.due_at <= now() THEN 'pending' ELSE 'scheduled' END, i.due_at,
           0, i.input::jsonb, i.trace::jsonb
    FROM run JOIN input AS i ON i.tenant = run.tenant AND i.id = run.id
    ORDER BY i.ord
    RETURNING id, run_pk, state, queue
), total AS (
    -- The shard's count before the statement (its snapshot), and its lease.
    SELECT coalesce(sum(running), 0)::bigint AS running, harvest_shard_lease() AS lease FROM tenant_running
), counted AS (
    INSERT INTO tenant_running AS t (tenant, running)
    SELECT tenant, count(*) FROM run GROUP BY tenant ORDER BY tenant COLLATE "C"
    ON CONFLICT (tenant) DO UPDATE SET running = t.running + excluded.running
    -- A tenant moving here is judged with its runs still on the old home.
    RETURNING tenant, running + coalesce((SELECT a.runs FROM tenant_away a WHERE a.tenant = t.tenant), 0) AS running
), not_due AS (
    -- Runs not due yet, per tenant with such a start in the group: those
    -- of the statement's snapshot and the group's own. Groups of due
    -- starts only (nearly all of them) read nothing here.
    SELECT run.tenant,
           (SELECT count(*) FROM runs h
            WHERE h.tenant = run.tenant AND h.not_before > now() AND h.finished_at IS NULL)
           + count(*) AS held
    FROM run JOIN input AS i ON i.tenant = run.tenant AND i.id = run.id
    WHERE i.due_at > now()
    GROUP BY run.tenant
), guarded AS (
    -- Evaluated once (the function is volatile, so the CTE is not inlined).
    SELECT harvest_admission_guard(
               $17::bigint IS NULL
               OR (total.running + (SELECT count(*) FROM run) <= $17::bigint
                   AND ($18::boolean IS NOT TRUE OR total.running + (SELECT count(*) FROM run) <= total.lease)
                   AND NOT EXISTS (SELECT 1
                                   FROM counted AS c
                                   JOIN unnest($15::text[], $16::bigint[]) AS g (tenant, cap) USING (tenant)
                                   WHERE c.running > g.cap))) AS ok
    FROM total
)
SELECT run.tenant, run.id, run.pk, task.id, task.state = 'pending',
       EXISTS (SELECT 1 FROM tasks x WHERE x.queue = task.queue AND x.state = 'pending'),
       counted.running,
       total.running,
       now(),
       total.lease,
       guarded.ok,
       coalesce(not_due.held, 0)
FROM run
JOIN task ON task.run_pk = run.pk
JOIN counted ON counted.tenant = run.tenant
LEFT JOIN not_due ON not_due.tenant = run.tenant
CROSS JOIN total
CROSS JOIN guarded
