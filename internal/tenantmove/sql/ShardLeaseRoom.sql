-- Whether the shard's capacity lease covers its unfinished runs and $1
-- more. Sent under the shard's admission lock, so no start can take the
-- room between this check and the commit.
SELECT harvest_shard_running() + $1::bigint <= harvest_shard_lease()
