-- A tenant's unfinished runs, in the order a listing reads them.
--
-- A listing filtered to statuses only unfinished runs can show (deferred,
-- queued, running: GET /v1/runs?status=queued, say) reads newest first
-- through runs_tenant_pk, which holds every run of the tenant: it visited
-- each finished run of the history on its way, to keep none of them. On a
-- tenant with 200,000 finished runs and three queued ones that was 150 ms
-- a page; a request any tenant may send, costing in proportion to history
-- that retention keeps for a week.
--
-- The listing now states finished_at IS NULL for such filters
-- (runstore.List), and this index holds only the unfinished runs, in the
-- listing's order, so it reads them and nothing else. It also serves what
-- runs_unfinished_tenant served (a tenant's unfinished runs counted by the
-- recount, the tenant move and the deferred limits, all by their leading
-- column and predicate), so that index goes: a run start writes one entry
-- for both purposes, as before. Nothing names either index; a binary of
-- the previous release gets the same plans from this one.
CREATE INDEX runs_unfinished_tenant_pk ON runs (tenant, pk DESC) WHERE finished_at IS NULL;
DROP INDEX runs_unfinished_tenant;
