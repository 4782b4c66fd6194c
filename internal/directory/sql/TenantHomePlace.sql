-- Record a tenant's first home ($2, chosen by the caller) unless it has
-- one. No row comes back when another caller recorded it first: read it
-- then (a row inserted by a concurrent statement is not in this one's
-- snapshot).
INSERT INTO tenant_homes (tenant, shard, placed_by)
VALUES ($1, $2, 'hash')
ON CONFLICT (tenant) DO NOTHING
RETURNING tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at
