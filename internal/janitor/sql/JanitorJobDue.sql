-- Whether the shard's job $2 (a name under janitor.) is due: true at most
-- once per $1 microseconds (database clock), whichever janitor asks. The
-- time of the job's last run is kept in the shard's settings table under
-- a name of its own.
WITH due AS (
    INSERT INTO settings AS s (name, value, updated_by)
    VALUES ('janitor.' || $2::text, to_jsonb(now()), 'janitor')
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = now()
    WHERE (s.value #>> '{}')::timestamptz <= now() - $1::bigint * interval '1 microsecond'
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM due)
