-- Change the tenant's count by $2 (negative: lower it). The caller holds
-- the row's lock; the floor only guards against a count that drifted,
-- which the settle step corrects.
UPDATE tenant_running SET running = greatest(0, running + $2) WHERE tenant = $1
