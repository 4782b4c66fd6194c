-- Cancel a waiting run (status deferred, no task): final, with the reason,
-- and its admission slot released (harvest_run_finish, shared with every
-- other way a run ends).
SELECT harvest_run_finish($1, 'cancelled', NULL, $2)
