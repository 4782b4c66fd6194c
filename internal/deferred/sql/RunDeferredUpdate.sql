-- A later debounce start replaces what the waiting run shows.
UPDATE runs SET name = $3, fairness_key = $4, quota_key = $5, priority = $6, input = $7::jsonb,
                max_attempts = $8, timeout_ms = $9
WHERE tenant = $1 AND id = $2 AND status = 'deferred'
