-- The run a group will fire, written now with status 'deferred' and no
-- task: it reserves the id and answers reads until the group fires. Its
-- not_before is infinity: until it fires (and is replaced by the real
-- run) it is one of the tenant's runs not due yet, which admission holds
-- to a share of the tenant's budget (runs_not_due).
-- $1 tenant, $2 id, $3 name, $4 queue, $5 fairness key, $6 quota key,
-- $7 priority, $8 input, $9 request hash, $10 max attempts, $11 timeout ms,
-- $12 whether the run's end is announced (later starts of the group and
-- long polls on it may set it; the fired run takes it from here).
INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                  request_hash, max_attempts, timeout_ms, status, not_before, notify)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, 'deferred', 'infinity', $12)
ON CONFLICT (tenant, id) DO NOTHING
RETURNING pk
