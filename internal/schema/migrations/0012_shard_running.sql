-- shard_running: the shard's count of unfinished runs over all tenants,
-- kept up to date so that a start reads a few rows instead of summing
-- tenant_running over every tenant of the shard.
--
-- The count is sum(added) - sum(removed), and the trigger on tenant_running
-- (harvest_running_total) keeps it equal to sum(tenant_running.running):
-- whatever raises a tenant's count adds the rise to stripe 0, whatever
-- lowers one adds the fall to the removed column of the tenant's stripe,
-- 1 + (hashtext(tenant) & 15) (harvest_running_stripe). Both figures only
-- grow, as the lease's granted and returned do.
--
-- Why two kinds of row: the counts go up under the shard's admission lock
-- (starts, deferred holds, retries), which already serialises those
-- transactions, so one row for every rise costs them no wait of their
-- own; they come down in completion batches, the rescue and cancels, which
-- no lock serialises, so the falls are spread over sixteen rows and two
-- batches of tenants on different stripes never wait for each other here.
-- A start group therefore never waits for a completion batch's flush on
-- this table, and a completion batch waits for another only when their
-- tenants share a stripe. Lock order: tenant_running rows in byte order,
-- then these rows by stripe ascending (harvest_running_lock).
--
-- tenantcap.Drift compares the count with sum(tenant_running.running) and
-- tenantcap.Recount heals it, as it heals the tenants' counts. The table
-- is filled under a lock that keeps every writer of tenant_running out
-- until the migration's transaction, which also creates the trigger (the
-- functions are applied in it), commits: no change falls between the two.
LOCK TABLE tenant_running IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE shard_running (
    stripe  smallint PRIMARY KEY CHECK (stripe BETWEEN 0 AND 16),
    added   bigint   NOT NULL DEFAULT 0,
    removed bigint   NOT NULL DEFAULT 0
) WITH (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

INSERT INTO shard_running (stripe, added)
SELECT s, CASE WHEN s = 0 THEN (SELECT coalesce(sum(running), 0) FROM tenant_running) ELSE 0 END
FROM generate_series(0, 16) AS s;
