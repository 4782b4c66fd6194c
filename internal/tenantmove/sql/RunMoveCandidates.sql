-- The tenant's next runs to move: not taken off already, not waiting as
-- deferred starts (the deferred step moves those), and with no task
-- leased to a worker (they finish here first). Oldest first.
SELECT r.pk
FROM runs r
WHERE r.tenant = $1
  AND r.status <> 'deferred'
  AND NOT EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk)
  AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_pk = r.pk AND t.state = 'running')
ORDER BY r.pk
LIMIT $2
