-- Set the locked counts ($1; NULL: every row) to the tenant's runs that are
-- not final. As a new statement after the locks it sees every start and
-- finish committed before them; the ones still in flight add or remove
-- their run after this commit.
WITH actual AS (
    SELECT tenant, count(*) AS n FROM runs
    WHERE finished_at IS NULL
      AND ($1::text[] IS NULL OR tenant = ANY($1))
    GROUP BY tenant
)
UPDATE tenant_running t SET running = coalesce(a.n, 0)
FROM tenant_running t2 LEFT JOIN actual a ON a.tenant = t2.tenant
WHERE t.tenant = t2.tenant AND t.running <> coalesce(a.n, 0)
  AND ($1::text[] IS NULL OR t.tenant = ANY($1))
RETURNING t.tenant, t2.running::bigint AS was, t.running::bigint AS now, false AS created, false AS total
