-- Hand a claimed task back untouched (graceful stop): pending again in its
-- old place, the attempt not counted, the run queued again. Fenced by the
-- lease token; a stale token changes nothing and returns no row.
WITH t AS (
    UPDATE tasks SET state = 'pending', attempt = greatest(attempt - 1, 0),
                     lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
    WHERE id = $1 AND state = 'running' AND lease_token = $2
    RETURNING run_pk
), r AS (
    UPDATE runs SET status = 'queued', attempts = greatest(attempts - 1, 0)
    WHERE pk IN (SELECT run_pk FROM t) AND status = 'running'
    RETURNING pk
)
SELECT count(*) FROM t
