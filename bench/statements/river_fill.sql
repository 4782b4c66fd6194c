-- The flood of river-bench, as plain rows (:rows available jobs).
INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at)
SELECT '{"tenant":"flood"}', 'flood', 25, 1, 'default', 'available', now() - interval '1 minute'
FROM generate_series(1, :rows);
VACUUM ANALYZE river_job;
CHECKPOINT;
