-- Whether the shard's capacity lease covers its unfinished runs and $1
-- more. Sent under the shard's admission lock, so no start can take the
-- room between this check and the commit.
SELECT coalesce((SELECT sum(running) FROM tenant_running), 0) + $1::bigint <= harvest_shard_lease()
