-- Remove the override of ($1 queue, $2 key), audited as actor $3.
SELECT outcome, old_weight, overrides FROM harvest_weight_clear($1, $2, $3)
