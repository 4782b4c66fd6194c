-- A test run: $1 tenant, $2 id (NULL: a random one), $3 workflow name,
-- $4 queue, $5 fairness key, $6 quota key, $7 max attempts; counted for
-- its tenant when $8 is true, as a start counts it.
WITH r AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, request_hash, max_attempts)
    VALUES ($1, coalesce($2, gen_random_uuid()::text), $3, $4, $5, $6, '\x00', $7)
    RETURNING pk, tenant
), c AS (
    INSERT INTO tenant_running (tenant, running)
    SELECT tenant, 1 FROM r WHERE $8::boolean
    ON CONFLICT (tenant) DO UPDATE SET running = tenant_running.running + 1
)
SELECT pk FROM r
