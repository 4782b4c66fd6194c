-- The run a member start (of a debounce window or batch) stands for, with
-- its group's mode.
SELECT g.run_id, g.mode
FROM deferred_starts s JOIN deferred_groups g ON g.pk = s.group_pk
WHERE s.tenant = $1 AND s.id = $2
