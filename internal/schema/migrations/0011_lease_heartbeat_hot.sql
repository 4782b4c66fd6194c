-- A heartbeat rewrites only tasks.lease_expires_at. While that column was
-- indexed (tasks_lease_expiry), every heartbeat of every running task wrote
-- a new heap tuple and a new index entry, and left a dead one behind: the
-- heaviest write of a long task. With no index naming the column (in its
-- keys or its predicate), a heartbeat is a HOT update: the new version
-- stays on the row's page and no index is touched.
--
-- The rescue of expired leases still needs to find running tasks without
-- reading the table: it reads them from tasks_running, whose entries are
-- written when a task starts running (the claim is not a HOT update anyway:
-- it changes state) and which a heartbeat never touches. The running tasks
-- are bounded by the fleet's slots, so reading them all and keeping those
-- whose lease expired is exact and small. The index is keyed on id so that
-- a statement that looks running tasks up by id (a completion batch, a
-- heartbeat) reads it by id if the planner picks it, never end to end.
DROP INDEX IF EXISTS tasks_lease_expiry;
CREATE INDEX tasks_running ON tasks (id) WHERE state = 'running';

-- A HOT update also needs room on the row's page for the new version.
-- Rows written by inserts fill their pages, and a backlog claimed in order
-- leaves whole pages of running rows: with full pages a heartbeat of them
-- finds room for a few new versions per page, and the others move to
-- another page with a new entry in every index. Leave 30% of each new page
-- free. Measured on 5,000 rows claimed 200 at a time in order, five
-- heartbeats of each batch: 13% of the heartbeats were HOT at fillfactor
-- 100, 29% at 90, 89% at 70, 97% at 50. 70 costs a backlog or a history
-- of finished tasks about 40% more pages than full ones.
ALTER TABLE tasks SET (fillfactor = 70);
