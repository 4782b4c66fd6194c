-- The tasks of each queue of $1 that wait (pending: due; scheduled: due
-- later) or run. Each state is counted on its own, with the state as an
-- equality, so that each count can read the partial index of that state
-- (tasks_pending_order, tasks_scheduled_due, tasks_running) and never the
-- finished rows the table keeps until retention deletes them. A single
-- count with state <> 'done' matches no partial index, and was a scan of
-- the whole table, history included, at every scrape of every worker.
-- The caller turns sequential scans off first (readBacklog says why).
-- Rows come in the order of $1.
SELECT q.queue,
       (SELECT count(*) FROM tasks t WHERE t.queue = q.queue AND t.state = 'pending') AS pending,
       (SELECT count(*) FROM tasks t WHERE t.queue = q.queue AND t.state = 'scheduled') AS scheduled,
       (SELECT count(*) FROM tasks t WHERE t.queue = q.queue AND t.state = 'running') AS running
FROM unnest($1::text[]) WITH ORDINALITY AS q(queue, o)
ORDER BY q.o
