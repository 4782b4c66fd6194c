-- Lock the tenant's running-count row (made at zero when missing) before
-- anything else, as the start committer does: every deferred accept and
-- firing of a tenant then takes its locks in one order (count, throttle
-- key, group, run, task), and accepts of one tenant take turns, so
-- the id checks that follow see every earlier start of the tenant.
INSERT INTO tenant_running AS t (tenant, running) VALUES ($1, 0)
ON CONFLICT (tenant) DO UPDATE SET running = t.running
