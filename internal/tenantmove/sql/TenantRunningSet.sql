-- Set the tenant's count to its exact number of unfinished runs here and
-- return it. The caller holds the row's lock, which every start and finish
-- of the tenant takes first, so the count read is exact.
UPDATE tenant_running
SET running = (SELECT count(*) FROM runs WHERE tenant = $1 AND finished_at IS NULL)
WHERE tenant = $1
RETURNING running
