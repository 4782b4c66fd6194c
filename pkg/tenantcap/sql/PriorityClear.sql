-- Remove tenant $1's priority ceiling (back to the default); returns the
-- one removed, if any.
DELETE FROM tenant_priority WHERE tenant = $1 RETURNING max_priority
