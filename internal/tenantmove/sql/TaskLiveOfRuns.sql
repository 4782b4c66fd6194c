-- Tasks of runs $1 still in play here (not moving, not done): a claim, a
-- continuation or a retry got to the run first.
SELECT run_pk, state FROM tasks
WHERE run_pk = ANY ($1::bigint[]) AND state IN ('pending', 'scheduled', 'running')
