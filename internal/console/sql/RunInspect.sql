-- The run $2 of tenant $1 (the runs (tenant, id) unique index) for its
-- console page: the run's columns, its input and attempt cap, whether a
-- tenant move is copying it away (move_out) and the trace context of its
-- first task, the start's, whose trace the run's page links to. The run
-- is read as it shows (runs_seen), as the gateway reads it.
SELECT r.pk, r.id, r.tenant, r.name, r.queue, r.fairness_key, r.quota_key, r.priority,
       r.status, r.attempts, r.created_at, r.claimed_at, r.finished_at, r.output, r.error,
       r.input, r.max_attempts,
       EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk) AS moving,
       (SELECT t.trace_context
        FROM tasks t WHERE t.run_pk = r.pk
        ORDER BY t.id LIMIT 1) AS trace_context
FROM runs_seen r
WHERE r.tenant = $1 AND r.id = $2
