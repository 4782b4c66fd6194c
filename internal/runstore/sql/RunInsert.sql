-- Insert a run unless one with the same (tenant, id) exists. ON CONFLICT DO
-- NOTHING waits for a concurrent insert of the same id to commit, so two
-- gateways racing on one id make exactly one run.
INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input,
                  request_hash, max_attempts, timeout_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, id) DO NOTHING
RETURNING pk
