-- Tenants ($1; NULL: any) with unfinished runs but no count row at all get
-- one. A start that creates the row concurrently wins; the next recount
-- checks it.
INSERT INTO tenant_running (tenant, running)
SELECT r.tenant, count(*) FROM runs r
WHERE r.finished_at IS NULL
  AND ($1::text[] IS NULL OR r.tenant = ANY($1))
  AND NOT EXISTS (SELECT 1 FROM tenant_running t WHERE t.tenant = r.tenant)
GROUP BY r.tenant
ON CONFLICT (tenant) DO NOTHING
RETURNING tenant, 0::bigint AS was, running::bigint AS now, true AS created, false AS total
