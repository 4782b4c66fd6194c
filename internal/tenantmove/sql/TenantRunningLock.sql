-- Lock the tenant's count row (created at zero when missing) the way a
-- start does, and return the count. Starts, finishes, deferred accepts and
-- firings of the tenant take this row first, so holding it orders the
-- move's step with all of them.
INSERT INTO tenant_running AS t (tenant, running)
VALUES ($1, 0)
ON CONFLICT (tenant) DO UPDATE SET running = t.running
RETURNING running
