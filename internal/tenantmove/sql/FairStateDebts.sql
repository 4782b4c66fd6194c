-- The tenant's keys that owe the queue something: pass ahead of the
-- queue's clock V. $1 is the tenant, $2 the LIKE pattern of its sub-keys
-- ('<tenant>/%' with the LIKE characters escaped by a backslash).
SELECT s.queue, s.key, s.pass - coalesce(q.clock, 0) AS lag
FROM fair_state s
LEFT JOIN fair_queues q ON q.queue = s.queue
WHERE (s.key = $1 OR s.key LIKE $2 ESCAPE '\')
  AND s.pass IS NOT NULL
  AND s.pass > coalesce(q.clock, 0)
ORDER BY s.queue, s.key
