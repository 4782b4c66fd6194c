-- Lock the running-count rows of a group's tenants (sorted, distinct) before
-- any start of the group writes: every start transaction then takes its
-- locks in one order (counts by tenant, then key summaries by queue and key,
-- as the group is sorted), so concurrent groups queue instead of
-- deadlocking. A missing row is created at zero. The shard's admission
-- lock comes before all of them (harvest_shard_admission_lock).
WITH shard AS (SELECT harvest_shard_admission_lock())
INSERT INTO tenant_running AS t (tenant, running)
SELECT tenant, 0 FROM unnest($1::text[]) AS u (tenant), shard
ORDER BY tenant
ON CONFLICT (tenant) DO UPDATE SET running = t.running
