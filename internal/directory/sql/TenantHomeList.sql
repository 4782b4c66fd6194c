-- Every entry, in tenant order.
SELECT tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at
FROM tenant_homes
ORDER BY tenant
