-- The queues that hold fairness state or new arrivals, in byte order.
SELECT q.queue FROM (
    SELECT queue FROM fair_state
    UNION
    SELECT queue FROM fair_arrivals
) q
ORDER BY q.queue COLLATE "C"
