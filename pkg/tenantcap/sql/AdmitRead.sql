-- The tenant's unfinished runs, the shard's total and the shard's capacity
-- lease. A statement after the locks sees every start of the tenant that
-- committed before they were granted; later ones wait for them. A tenant
-- moving here counts its runs still on the old home too (tenant_away).
SELECT (coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)
        + coalesce((SELECT runs FROM tenant_away WHERE tenant = $1), 0))::bigint AS own,
       harvest_shard_running() AS local,
       harvest_shard_lease() AS lease
