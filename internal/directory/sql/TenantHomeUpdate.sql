-- Change a tenant's entry if it is still at version $7 (nobody changed it
-- in between): its home, phase, the shard a move goes to and the shard it
-- comes from, and how it was placed. No row: the version was not current.
UPDATE tenant_homes
SET shard = $2, phase = $3, move_to = $4, moving_from = $5, placed_by = $6,
    version = version + 1, updated_at = now()
WHERE tenant = $1 AND version = $7
RETURNING tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at
