-- Replace the rechecks of ($1 queue, $2 quota key): $3 max_concurrent,
-- $4 rate, $5 burst (NULL: no such limit), audited as actor $6.
SELECT outcome, old_value FROM harvest_quota_set($1, $2, $3, $4, $5, $6)
