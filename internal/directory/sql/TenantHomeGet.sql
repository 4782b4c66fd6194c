-- One tenant's entry.
SELECT tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at
FROM tenant_homes
WHERE tenant = $1
