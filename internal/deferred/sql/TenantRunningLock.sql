-- Lock the tenant's running-count row (made at zero when missing) before
-- anything else, as the start committer does: every deferred accept and
-- firing of a tenant then takes its locks in one order (count, throttle
-- key, group, run, task), and accepts of one tenant take turns, so
-- the id checks that follow see every earlier start of the tenant.
-- The shard's admission lock comes first (harvest_shard_admission_lock).
WITH shard AS (SELECT harvest_shard_admission_lock())
INSERT INTO tenant_running AS t (tenant, running)
SELECT $1, 0 FROM shard
ON CONFLICT (tenant) DO UPDATE SET running = t.running
