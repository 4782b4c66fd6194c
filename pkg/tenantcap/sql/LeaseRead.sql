-- This shard's lease row and its count of unfinished runs.
SELECT l.granted, l.returned, (SELECT coalesce(sum(running), 0) FROM tenant_running)::bigint AS running
FROM admission_lease l
