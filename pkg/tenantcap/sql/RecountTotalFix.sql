-- Set the shard's count to the sum of the tenants' counts, under the locks
-- of RecountStripesLock (every row). A new statement after those locks sees every
-- change of a count committed before them, and its stripes with it; the
-- changes still in flight are in neither and add themselves afterwards.
-- Returns the count before and the count it must be (now set).
WITH want AS (
    SELECT coalesce(sum(running), 0)::bigint AS total FROM tenant_running
), have AS (
    SELECT coalesce(sum(added) - sum(removed), 0)::bigint AS total FROM shard_running
), fixed AS (
    UPDATE shard_running s SET added = s.added + (want.total - have.total)
    FROM want, have
    WHERE s.stripe = 0 AND want.total <> have.total
    RETURNING s.stripe
)
SELECT have.total AS was, want.total AS now FROM want, have
