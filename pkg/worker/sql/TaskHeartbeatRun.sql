-- Extend the lease of a claimed task (lease-fenced, database clock) and say
-- where its run stands, so a run cancelled meanwhile reaches its handler.
SELECT harvest_heartbeat($1, $2, $3::bigint * interval '1 microsecond'),
       (SELECT r.status FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE t.id = $1)
