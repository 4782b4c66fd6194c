-- Extend the leases of several tasks at once, each fenced by its own token
-- (database clock), and say which were lost or belong to cancelled runs.
SELECT task_id, outcome FROM harvest_heartbeat_many($1::bigint[], $2::uuid[], $3::bigint * interval '1 microsecond')
