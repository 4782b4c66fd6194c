-- Mark the run final and release its tenant's running count, unless it is
-- final already (schema function shared with completion): $2 the status,
-- $3 the error, $4 the attempts in flight that end with it (the running
-- tasks the cancel took out) and $5 the earliest claim time among them,
-- counted in the run as an outcome counts its attempt.
SELECT harvest_run_finish($1, $2, NULL, $3, $4, $5)
