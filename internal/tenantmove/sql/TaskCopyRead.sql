-- The tasks of runs $1 the copy takes, as JSON rows, each with its run's
-- id (run_id), which is what names the run on the other shard: the moving
-- ones (a run's live task, hidden from claims) and the done ones (the
-- run's history: its attempts and claims).
SELECT coalesce(jsonb_agg(to_jsonb(t) || jsonb_build_object('run_id', r.id) ORDER BY t.id), '[]'::jsonb)
FROM tasks t
JOIN runs r ON r.pk = t.run_pk
WHERE t.run_pk = ANY ($1::bigint[]) AND t.state IN ('moving', 'done')
