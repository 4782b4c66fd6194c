-- The queues with pending work, by a loose scan of the seek index, plus
-- the queues that hold fairness state or arrivals, in byte order.
WITH RECURSIVE p(queue) AS (
    (SELECT queue FROM tasks WHERE state = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.state = 'pending' AND t.queue > p.queue ORDER BY t.queue LIMIT 1)
    FROM p WHERE p.queue IS NOT NULL
)
SELECT q.queue FROM (
    SELECT queue FROM p WHERE queue IS NOT NULL
    UNION
    SELECT queue FROM fair_state
    UNION
    SELECT queue FROM fair_arrivals
) q
ORDER BY q.queue COLLATE "C"
