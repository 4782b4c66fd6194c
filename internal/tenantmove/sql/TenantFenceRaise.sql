-- Refuse the tenant's starts on this shard from now on: they belong on
-- shard $2. Idempotent; a fence left by an earlier move is pointed anew.
INSERT INTO tenant_fences (tenant, moved_to) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE SET moved_to = excluded.moved_to
