-- Record a tenant's home as an operator chose it ($3: 'pin' or 'move'),
-- for a tenant with no entry yet. No row: it has one.
INSERT INTO tenant_homes (tenant, shard, placed_by)
VALUES ($1, $2, $3)
ON CONFLICT (tenant) DO NOTHING
RETURNING tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at
