-- Queue $1 on one shard: its tasks by state, the claims of the last minute
-- and its pause; one row, zeros where the queue has nothing here. Each
-- count reads the partial index of its state with the queue fixed
-- (tasks_scheduled_due, tasks_pending_order; running tasks are the ones
-- with a lease, tasks_lease_expiry; moving ones belong to runs in
-- move_out), the claims tasks_claimed_at. Done tasks are never read.
SELECT $1::text AS queue,
       (SELECT count(*) FROM tasks t WHERE t.state = 'scheduled' AND t.queue = $1::text) AS scheduled,
       (SELECT count(*) FROM tasks t WHERE t.state = 'pending' AND t.queue = $1::text) AS pending,
       (SELECT count(*) FROM tasks t
        WHERE t.lease_expires_at IS NOT NULL AND t.state = 'running' AND t.queue = $1::text) AS running,
       (SELECT count(*) FROM move_out m JOIN tasks t ON t.run_pk = m.run_pk
        WHERE t.state = 'moving' AND t.queue = $1::text) AS moving,
       (SELECT count(*) FROM tasks t
        WHERE t.queue = $1::text AND t.claimed_at IS NOT NULL
          AND t.claimed_at >= now() - interval '1 minute') AS claims_last_minute,
       p.paused_at, p.paused_by
FROM (SELECT 1) one
LEFT JOIN queue_pauses p ON p.queue = $1::text
