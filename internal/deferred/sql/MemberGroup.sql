-- The group a member start belongs to.
SELECT g.run_id, g.mode, g.state, g.fires_at
FROM deferred_starts s JOIN deferred_groups g ON g.pk = s.group_pk
WHERE s.tenant = $1 AND s.id = $2
