-- Make sure the queue has a clock row (a queue without one has clock 0,
-- harvest_clock) and return its clock. The caller holds the fair lock.
WITH ins AS (
    INSERT INTO fair_queues (queue, clock) VALUES ($1, 0)
    ON CONFLICT (queue) DO NOTHING
    RETURNING clock
)
SELECT clock FROM ins
UNION ALL
SELECT clock FROM fair_queues WHERE queue = $1
LIMIT 1
