-- Delete up to $2 audit rows written more than $1 microseconds ago
-- (database clock), oldest first. The audit_at index serves the scan, so a
-- batch reads only the rows it deletes however long the table is. Rows
-- another janitor is deleting at the same time are skipped, not waited for.
WITH gone AS (
    DELETE FROM audit WHERE id IN (
        SELECT id FROM audit
        WHERE at < now() - $1::bigint * interval '1 microsecond'
        ORDER BY at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone
