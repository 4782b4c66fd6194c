-- Mark the run final and release its tenant's running count, unless it is
-- final already (schema function shared with completion).
SELECT harvest_run_finish($1, $2, NULL, $3)
