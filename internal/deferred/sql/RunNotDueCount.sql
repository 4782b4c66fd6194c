-- Tenant $1's runs not due yet on this shard: started with run_at or a
-- delay still ahead, or waiting for their deferred start to fire
-- (runs.not_before, index runs_not_due).
SELECT count(*) FROM runs WHERE tenant = $1 AND not_before > now() AND finished_at IS NULL
