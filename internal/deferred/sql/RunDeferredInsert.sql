-- The run a group will fire, written now with status 'deferred' and no
-- task: it reserves the id and answers reads until the group fires.
-- $1 tenant, $2 id, $3 name, $4 queue, $5 fairness key, $6 quota key,
-- $7 priority, $8 input, $9 request hash, $10 max attempts, $11 timeout ms.
INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                  request_hash, max_attempts, timeout_ms, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, 'deferred')
ON CONFLICT (tenant, id) DO NOTHING
RETURNING pk
