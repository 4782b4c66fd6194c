-- What a cancel of id $2 of tenant $1 aims at, in one read without locks:
-- the run a member start of a debounce window or batch stands for, with
-- its group's mode ('' for any other id, which names its own run), and
-- that run's status (NULL: no such run). The cancel picks its route by the
-- status and checks it again under the locks it then takes.
SELECT coalesce(g.run_id, q.id) AS run_id, coalesce(g.mode, '') AS mode, r.status
FROM (SELECT $1::text AS tenant, $2::text AS id) AS q
LEFT JOIN deferred_starts s ON s.tenant = q.tenant AND s.id = q.id
LEFT JOIN deferred_groups g ON g.pk = s.group_pk
LEFT JOIN runs r ON r.tenant = q.tenant AND r.id = coalesce(g.run_id, q.id)
