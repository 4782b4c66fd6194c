-- Delete up to $2 runs that reached a final state more than $1 microseconds
-- ago (database clock); their tasks go with them (ON DELETE CASCADE).
WITH gone AS (
    DELETE FROM runs WHERE pk IN (
        SELECT pk FROM runs
        WHERE finished_at < now() - $1::bigint * interval '1 microsecond'
          AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at
        LIMIT $2
    )
    RETURNING 1
)
SELECT count(*) FROM gone
