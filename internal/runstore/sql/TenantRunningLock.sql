-- Lock the running-count rows of a group's tenants (distinct) before any
-- start of the group writes: every start transaction then takes its locks
-- in one order (counts by tenant, then key summaries by queue and key, as
-- the group is sorted), so concurrent groups queue instead of deadlocking.
-- A missing row is created at zero. The shard's admission lock comes
-- before all of them (harvest_shard_admission_lock).
--
-- Tenant rows are taken in byte order (COLLATE "C") by every statement
-- that holds several of them (starts, completion batches, the rescue of
-- expired leases, the recount): the database's own collation may sort
-- "a_b" before "a-c" or "a" before "B" where bytes do not, and two orders
-- would deadlock.
WITH shard AS (SELECT harvest_shard_admission_lock())
INSERT INTO tenant_running AS t (tenant, running)
SELECT tenant, 0 FROM unnest($1::text[]) AS u (tenant), shard
ORDER BY tenant COLLATE "C"
ON CONFLICT (tenant) DO UPDATE SET running = t.running
