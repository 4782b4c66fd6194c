-- The queues of one shard for the console, by name, at most $1: every
-- queue with a task not done, fairness state, a weight override or a
-- pause, with its tasks by state, the claims of the last minute and its
-- pause. With $2 set, that queue alone, in one row (zeros where it has
-- nothing here), and the list of queues is not read. Done tasks (the
-- history) are never read:
--   * the queues with pending or scheduled tasks come from a loose scan
--     (one probe per queue) of tasks_pending_order and tasks_scheduled_due,
--     and those with fairness state from the primary key of fair_state;
--   * running tasks come from tasks_running (a partial index), moving
--     ones belong to runs in move_out: both sets are small;
--   * each queue's counts read the same partial indexes with the queue
--     fixed, and its claims of the last minute tasks_claimed_at.
WITH RECURSIVE
pending_q AS (
    (SELECT queue FROM tasks WHERE state = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t
            WHERE t.state = 'pending' AND t.queue > p.queue
            ORDER BY t.queue LIMIT 1)
    FROM pending_q p WHERE p.queue IS NOT NULL
),
scheduled_q AS (
    (SELECT queue FROM tasks WHERE state = 'scheduled' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t
            WHERE t.state = 'scheduled' AND t.queue > s.queue
            ORDER BY t.queue LIMIT 1)
    FROM scheduled_q s WHERE s.queue IS NOT NULL
),
fair_q AS (
    (SELECT queue FROM fair_state ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT f.queue FROM fair_state f WHERE f.queue > q.queue ORDER BY f.queue LIMIT 1)
    FROM fair_q q WHERE q.queue IS NOT NULL
),
running AS (
    SELECT queue, count(*) AS n
    FROM tasks
    WHERE lease_expires_at IS NOT NULL AND state = 'running'
    GROUP BY queue
),
moving AS (
    SELECT t.queue, count(*) AS n
    FROM move_out m JOIN tasks t ON t.run_pk = m.run_pk
    WHERE t.state = 'moving'
    GROUP BY t.queue
),
named AS (
    SELECT queue FROM pending_q WHERE queue IS NOT NULL
    UNION SELECT queue FROM scheduled_q WHERE queue IS NOT NULL
    UNION SELECT queue FROM fair_q WHERE queue IS NOT NULL
    UNION SELECT queue FROM running
    UNION SELECT queue FROM moving
    UNION SELECT queue FROM weight_overrides
    UNION SELECT queue FROM queue_pauses
),
-- Byte order (COLLATE "C"), the order the console sorts the shards' lists in,
-- so the queues a limit keeps are the first ones of the merged list.
picked AS (
    SELECT $2::text AS queue WHERE $2::text IS NOT NULL
    UNION ALL
    (SELECT queue FROM named WHERE $2::text IS NULL ORDER BY queue COLLATE "C" LIMIT $1)
)
SELECT q.queue,
       (SELECT count(*) FROM tasks t WHERE t.state = 'scheduled' AND t.queue = q.queue) AS scheduled,
       (SELECT count(*) FROM tasks t WHERE t.state = 'pending' AND t.queue = q.queue) AS pending,
       coalesce(r.n, 0) AS running,
       coalesce(mv.n, 0) AS moving,
       (SELECT count(*) FROM tasks t
        WHERE t.queue = q.queue AND t.claimed_at IS NOT NULL
          AND t.claimed_at >= now() - interval '1 minute') AS claims_last_minute,
       p.paused_at, p.paused_by
FROM picked q
LEFT JOIN running r ON r.queue = q.queue
LEFT JOIN moving mv ON mv.queue = q.queue
LEFT JOIN queue_pauses p ON p.queue = q.queue
ORDER BY q.queue COLLATE "C"
