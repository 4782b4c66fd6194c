-- The member starts of groups $1 as JSON rows, each with its group's run
-- id (run_id), which names the group on the other shard.
SELECT coalesce(jsonb_agg(to_jsonb(s) || jsonb_build_object('run_id', g.run_id) ORDER BY s.group_pk, s.position), '[]'::jsonb)
FROM deferred_starts s
JOIN deferred_groups g ON g.pk = s.group_pk
WHERE s.group_pk = ANY ($1::bigint[])
