-- Count a waiting deferred run for its tenant: it holds an admission slot
-- from its acceptance, like a run, until it is final.
UPDATE tenant_running SET running = running + 1 WHERE tenant = $1
RETURNING running
