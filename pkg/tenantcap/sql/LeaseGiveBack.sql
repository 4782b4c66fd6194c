-- Give back the shard's unused capacity beyond $1, under the shard's
-- admission lock (taken by the caller), so no start can be judged by the
-- larger lease meanwhile; a lease never falls below the shard's count.
-- Returns the lease row afterwards and the count.
WITH c AS (SELECT harvest_shard_running() AS running)
UPDATE admission_lease l
SET returned = l.returned + greatest(l.granted - l.returned - c.running - $1, 0)
FROM c
RETURNING l.granted, l.returned, c.running
