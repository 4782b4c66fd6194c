-- Drop groups that are done and no longer needed, at most $2:
--   * throttle: once its run left the key's window (at $1);
--   * debounce and batch: once their run is gone (deleted by retention), as
--     their members only resolve to that run.
-- Their member rows go with them.
WITH gone AS (
    DELETE FROM deferred_groups WHERE pk IN (
        SELECT g.pk FROM deferred_groups g
        WHERE g.state <> 'pending'
          AND CASE WHEN g.mode = 'throttle'
                   THEN coalesce(g.fired_at, g.opened_at) <= $1::timestamptz - g.period_us * interval '1 microsecond'
                   ELSE NOT EXISTS (SELECT 1 FROM runs r WHERE r.tenant = g.tenant AND r.id = g.run_id)
              END
        ORDER BY coalesce(g.fired_at, g.opened_at)
        LIMIT $2)
    RETURNING 1
)
SELECT count(*) FROM gone
