-- What decides why the run $2 of tenant $1 waits, in one read: the run,
-- its open task (the newest scheduled or pending one: a first task, a
-- continuation or a retry), the pause of the task's queue, the workers
-- that announced the queue (worker_presence; a row counts while its
-- live_until is ahead of the database clock, the rest is ignored), and
-- the quota of the task's quota key with its running count and the rate
-- bucket's tokens now, computed as the claim's recheck computes them
-- (harvest_claim_step, section 3). The run's status is the one it shows
-- (runs_seen): a run whose task a worker holds is running, not waiting.
WITH r AS (
    SELECT r.pk, r.status, r.queue
    FROM runs_seen r
    WHERE r.tenant = $1 AND r.id = $2
), t AS (
    SELECT x.id, x.queue, x.state, x.fairness_key, x.quota_key, x.priority, x.continuation, x.due_at
    FROM r, tasks x
    WHERE x.run_pk = r.pk AND x.state IN ('scheduled', 'pending')
    ORDER BY x.id DESC
    LIMIT 1
), q AS (
    SELECT coalesce((SELECT t.queue FROM t), (SELECT r.queue FROM r)) AS queue
)
SELECT r.pk, r.status, q.queue, now() AS now,
       t.id AS task_id, t.state AS task_state, t.fairness_key, t.quota_key, t.priority,
       t.continuation, t.due_at,
       p.paused_at, p.paused_by,
       (SELECT count(*) FROM worker_presence w WHERE w.queue = q.queue AND w.live_until > now()) AS live_workers,
       (SELECT count(*) FROM worker_presence w WHERE w.queue = q.queue AND w.live_until > now() AND w.fair) AS fair_workers,
       (SELECT max(w.seen_at) FROM worker_presence w WHERE w.queue = q.queue) AS last_seen_at,
       qu.max_concurrent, qu.rate, qu.burst,
       CASE WHEN qu.max_concurrent IS NOT NULL THEN
           (SELECT count(*) FROM tasks y
            WHERE y.queue = q.queue AND y.quota_key = t.quota_key AND y.quota_key <> '' AND y.state = 'running')
       END AS quota_running,
       CASE WHEN qu.rate IS NOT NULL THEN
           coalesce(least(qu.burst, b.tokens + qu.rate * harvest_secs(greatest(harvest_us(now(), b.updated_at), 0))),
                    qu.burst)
       END AS quota_tokens
FROM r
CROSS JOIN q
LEFT JOIN t ON true
LEFT JOIN queue_pauses p ON p.queue = q.queue
LEFT JOIN quotas qu ON qu.queue = q.queue AND qu.quota_key = t.quota_key AND t.quota_key <> ''
LEFT JOIN rate_buckets b ON b.queue = q.queue AND b.quota_key = t.quota_key
