-- Take the live tasks of runs $1 out of every claim, promotion and rescue:
-- 'moving' is a state none of them looks at. Tasks are locked before runs,
-- the order of claims, completions and cancels.
UPDATE tasks SET state = 'moving'
WHERE run_pk = ANY ($1::bigint[]) AND state IN ('pending', 'scheduled')
