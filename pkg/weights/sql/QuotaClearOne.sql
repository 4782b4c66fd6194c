-- Remove the rechecks of ($1 queue, $2 quota key), audited as actor $3.
SELECT outcome, old_value FROM harvest_quota_clear($1, $2, $3)
