-- A tenant's runs, newest first, one page. $2 is the cursor (list rows
-- below this pk), $3 the statuses, $4 the queue, $5 the workflow name; NULL
-- means no filter. $6 is the page's rows (its limit and one more), $7 the
-- stretch: the most runs the page reads, matching or not.
--
-- A filter that few runs match (a rare final status, a queue or name few
-- runs have) would otherwise read the tenant's history until the page is
-- full. The page reads the stretch newest first and stops at whichever
-- comes first, $6 matching runs or the stretch's end; every row streams
-- (index order, row_number, the limits), so a page that fills early reads
-- no further. A row comes back when it matches (matched), and the
-- stretch's last run comes back either way (seen = $7): when the page is
-- not full by then, the next page starts below it (runstore.List).
--
-- The runs_tenant_pk index serves the order and the cursor; for a status
-- filter only unfinished runs can match, runstore.List sends this text with
-- finished_at IS NULL added, which runs_unfinished_tenant_pk serves without
-- reading the tenant's finished history (and the stretch counts only
-- those).
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
SELECT s.*
FROM (SELECT pk, id, tenant, name, queue, fairness_key, quota_key, priority, status, attempts,
             created_at, claimed_at, finished_at, NULL::jsonb AS output, error,
             row_number() OVER (ORDER BY pk DESC) AS seen,
             ($3::text[] IS NULL OR status = ANY ($3::text[]))
               AND ($4::text IS NULL OR queue = $4::text)
               AND ($5::text IS NULL OR name = $5::text) AS matched
      FROM runs_seen
      WHERE tenant = $1
        AND pk < coalesce($2::bigint, 9223372036854775807)
      ORDER BY pk DESC
      LIMIT $7) AS s
WHERE s.matched OR s.seen = $7
ORDER BY s.pk DESC
LIMIT $6 + 1
