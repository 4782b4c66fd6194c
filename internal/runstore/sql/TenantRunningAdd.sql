INSERT INTO tenant_running AS t (tenant, running) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE SET running = t.running + EXCLUDED.running
RETURNING running
