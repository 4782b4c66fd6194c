-- Tenants whose running count differs from their unfinished runs, and the
-- shard's count (shard_running) when it differs from the sum of the
-- tenants' counts or misses one of its seventeen rows, read in one
-- snapshot and without locks. A start or a finish changes its run and the
-- counts in one transaction, so inside one snapshot they agree unless a
-- count really drifted (a crash, a manual edit). The last column marks
-- the shard's count: its row has no tenant, the stored count, the sum of
-- the tenants' counts, and whether rows are missing.
WITH actual AS (
    SELECT tenant, count(*) AS n FROM runs
    WHERE finished_at IS NULL
    GROUP BY tenant
), stored AS (
    SELECT coalesce(sum(added) - sum(removed), 0)::bigint AS total, count(*) AS rows FROM shard_running
), counted AS (
    SELECT coalesce(sum(running), 0)::bigint AS total FROM tenant_running
)
SELECT coalesce(t.tenant, a.tenant) AS tenant, coalesce(t.running, 0)::bigint AS was, coalesce(a.n, 0)::bigint AS now,
       t.tenant IS NULL AS created, false AS total
FROM tenant_running t FULL JOIN actual a ON a.tenant = t.tenant
WHERE coalesce(t.running, 0) <> coalesce(a.n, 0)
UNION ALL
SELECT '', s.total, c.total, s.rows <> 17, true
FROM stored s, counted c
WHERE s.total <> c.total OR s.rows <> 17
ORDER BY 5, 1
