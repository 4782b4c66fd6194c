-- Count a waiting deferred run for its tenant: it holds an admission slot
-- from its acceptance, like a run, until it is final.
UPDATE tenant_running SET running = running + 1 WHERE tenant = $1
-- A tenant moving here is judged with its runs still on the old home.
RETURNING running + coalesce((SELECT a.runs FROM tenant_away a WHERE a.tenant = $1), 0)
