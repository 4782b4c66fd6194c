-- Runs $1 as JSON rows, every column, as stored: a run is copied only
-- when no task of it runs (RunMoveCandidates, TaskLiveOfRuns), and then
-- its stored status, attempts and claimed_at are what it shows (the
-- view runs_seen adds only attempts in flight), so the copy shows the
-- same on the new home.
SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.pk), '[]'::jsonb)
FROM runs r
WHERE r.pk = ANY ($1::bigint[])
