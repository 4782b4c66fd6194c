-- Runs among $1 that have a task in state 'moving'.
SELECT DISTINCT run_pk FROM tasks WHERE run_pk = ANY ($1::bigint[]) AND state = 'moving'
