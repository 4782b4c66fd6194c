-- How many runs the tenant has here, and how many unfinished.
SELECT count(*)::bigint AS runs, count(*) FILTER (WHERE finished_at IS NULL)::bigint AS unfinished
FROM runs WHERE tenant = $1
