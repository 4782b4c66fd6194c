-- A tenant's runs, newest first, one page. $2 is the cursor (list rows
-- below this pk), $3 the statuses, $4 the queue, $5 the workflow name; NULL
-- means no filter. The runs_tenant_pk index serves the order and the cursor;
-- for a status filter only unfinished runs can match, runstore.List sends
-- this text with finished_at IS NULL added, which runs_unfinished_tenant_pk
-- serves without reading the tenant's finished history.
-- The cursor is a coalesce, not "$2 IS NULL OR", so that it stays an
-- index condition in a generic plan (made before the parameters are known,
-- which a prepared statement may keep): as a filter, each page read every
-- run above its cursor, and paging through a long history read it again
-- for every page.
-- The runs are read as they show (runs_seen), and the status filter is on
-- the status they show: a run whose task a worker holds is listed under
-- running, never under queued, whatever its stored status.
-- A listing leaves out each run's output, which can be as large as a
-- start's input (docs/api.md): the column stays, always NULL, so that
-- RunGet and RunList are read alike.
SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
       created_at, claimed_at, finished_at, NULL::jsonb AS output, error
FROM runs_seen
WHERE tenant = $1
  AND pk < coalesce($2::bigint, 9223372036854775807)
  AND ($3::text[] IS NULL OR status = ANY ($3::text[]))
  AND ($4::text IS NULL OR queue = $4::text)
  AND ($5::text IS NULL OR name = $5::text)
ORDER BY pk DESC
LIMIT $6
