-- What is left of the tenant here: runs, and of them the deferred ones.
SELECT count(*)::bigint AS runs, count(*) FILTER (WHERE status = 'deferred')::bigint AS deferred
FROM runs WHERE tenant = $1
