-- Record how many unfinished runs of the tenant the old home still counts.
INSERT INTO tenant_away (tenant, runs) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE SET runs = excluded.runs
