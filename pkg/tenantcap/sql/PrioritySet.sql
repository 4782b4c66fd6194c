-- Set tenant $1's priority ceiling to $2 as actor $3, refusing a new row
-- once $4 tenants have one (no row comes back then). Returns the ceiling
-- before (NULL: the default) and the row now stored. The caller holds
-- PriorityLock, so the count and the insert agree.
WITH old AS (
    SELECT p.max_priority FROM tenant_priority p WHERE p.tenant = $1
), room AS (
    SELECT EXISTS (SELECT 1 FROM old) OR (SELECT count(*) FROM tenant_priority) < $4 AS ok
), put AS (
    INSERT INTO tenant_priority AS p (tenant, max_priority, updated_at, updated_by)
    SELECT $1, $2, now(), $3 FROM room WHERE room.ok
    ON CONFLICT (tenant) DO UPDATE SET max_priority = excluded.max_priority, updated_at = now(),
                                       updated_by = excluded.updated_by
    RETURNING p.max_priority, p.updated_at, p.updated_by
)
SELECT (SELECT max_priority FROM old) AS old_max, put.max_priority, put.updated_at, put.updated_by
FROM put
