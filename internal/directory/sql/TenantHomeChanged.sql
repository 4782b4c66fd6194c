-- The entries changed since $1 (a time from this database's clock), and
-- the clock now, to ask from next time.
SELECT tenant, shard, phase, move_to, moving_from, placed_by, version, updated_at, now() AS read_at
FROM tenant_homes
WHERE updated_at >= $1
