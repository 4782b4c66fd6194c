-- What a cancel of id $2 of tenant $1 aims at, in one read without locks:
-- the run a member start of a debounce window or batch stands for, with
-- its group's mode ('' for any other id, which names its own run), and
-- that run's status (NULL: no such run). The cancel picks its route by the
-- status and checks it again under the locks it then takes.
SELECT t.run_id, t.mode, r.status
FROM (SELECT coalesce(m.run_id, $2) AS run_id, coalesce(m.mode, '') AS mode
      FROM (SELECT) AS one
      LEFT JOIN (SELECT g.run_id, g.mode
                 FROM deferred_starts s JOIN deferred_groups g ON g.pk = s.group_pk
                 WHERE s.tenant = $1 AND s.id = $2) AS m ON true) AS t
LEFT JOIN runs r ON r.tenant = $1 AND r.id = t.run_id
