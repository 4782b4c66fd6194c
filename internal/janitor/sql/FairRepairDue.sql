-- Whether the fairness heads of the shard are due for a repair from the
-- task rows: true at most once per $1 microseconds (database clock),
-- whichever janitor asks. The time of the last repair is kept in the
-- shard's settings table under a name of its own.
WITH due AS (
    INSERT INTO settings AS s (name, value, updated_by)
    VALUES ('janitor.fair_repaired_at', to_jsonb(now()), 'janitor')
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = now()
    WHERE (s.value #>> '{}')::timestamptz <= now() - $1::bigint * interval '1 microsecond'
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM due)
