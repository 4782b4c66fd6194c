-- How many runs the tenant has here.
SELECT count(*)::bigint AS runs
FROM runs WHERE tenant = $1
