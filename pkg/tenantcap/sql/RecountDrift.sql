-- Tenants whose running count differs from their unfinished runs, read in
-- one snapshot and without locks. A start or a finish changes its run and
-- the count in one transaction, so inside one snapshot the two agree unless
-- the count really drifted (a crash, a manual edit).
WITH actual AS (
    SELECT tenant, count(*) AS n FROM runs
    WHERE finished_at IS NULL
    GROUP BY tenant
)
SELECT coalesce(t.tenant, a.tenant), coalesce(t.running, 0)::bigint, coalesce(a.n, 0)::bigint, t.tenant IS NULL
FROM tenant_running t FULL JOIN actual a ON a.tenant = t.tenant
WHERE coalesce(t.running, 0) <> coalesce(a.n, 0)
ORDER BY 1
