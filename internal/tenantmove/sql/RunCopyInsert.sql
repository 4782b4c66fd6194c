-- Write runs (JSON rows of RunCopyRead) as they were on the old home, pk
-- aside, unless the shard holds the id already (a rerun of this step).
-- A run read from a shard without runs.notify (none, once both are
-- migrated) keeps its announcements.
-- Returns the runs written now.
INSERT INTO runs (tenant, id, name, queue, fairness_key, quota_key, priority, input, request_hash,
                  status, attempts, max_attempts, timeout_ms, output, error, created_at, claimed_at,
                  finished_at, not_before, notify)
SELECT tenant, id, name, queue, fairness_key, quota_key, priority, input, request_hash,
       status, attempts, max_attempts, timeout_ms, output, error, created_at, claimed_at,
       finished_at, not_before, coalesce(notify, true)
FROM jsonb_populate_recordset(NULL::runs, $1::jsonb)
ORDER BY pk
ON CONFLICT (tenant, id) DO NOTHING
RETURNING pk, id, finished_at IS NULL AS unfinished
