-- The tenant's unfinished runs (with those of a move still on its old
-- home, tenant_away), the shard's count over all tenants and the shard's
-- capacity lease, for a start that joins an open debounce window or batch:
-- it is asked as if it added a run, and adds none. The caller holds the
-- tenant's count row and the shard's admission lock, so the figures hold
-- until it commits.
SELECT (coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)
        + coalesce((SELECT runs FROM tenant_away WHERE tenant = $1), 0))::bigint AS own,
       harvest_shard_running() AS total,
       harvest_shard_lease() AS lease
