-- The runs of $1 with a task still in play here (not moving, not done): a
-- claim, a continuation or a retry got to the run first.
SELECT DISTINCT run_pk FROM tasks
WHERE run_pk = ANY ($1::bigint[]) AND state IN ('pending', 'scheduled', 'running')
