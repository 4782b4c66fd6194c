-- One shard's part of a console page of runs, newest handle first: the
-- runs below the shard's bound ($5 pk; NULL starts at the newest), with
-- the filters $1 tenant, $2 queue, $3 workflow name and $4 statuses (NULL:
-- no filter), at most $6 rows. Runs a tenant move is copying away
-- (move_out) are left out, their copy on the new home is listed instead.
--
-- The shard's part reads at most $7 runs (of the tenant, with $1),
-- matching the filters or not, as the API's listing does (RunList.sql in
-- internal/runstore): rows stream from the index, so a part that fills
-- early reads no further, and the stretch's last run comes back whether
-- it matches (matched) or not (seen = $7), for the caller to start the
-- shard's next read below it when the part did not fill.
--
-- The order is pk, not created_at, because only pk has an index to walk
-- (there is no index on created_at, and one would cost every start a
-- write): the scan starts at the bound and stops at the limit instead of
-- sorting every run the filters keep. The caller merges the shards by
-- creation time.
--
-- A page of the console shows neither output nor error, and either can be
-- large (an output is as large as a workflow makes it): both stay NULL
-- here, so that a page reads a few hundred bytes per run, and the run's
-- own page (RunInspect) reads them.
--
-- The two branches are there for the plan a prepared statement may keep
-- for every call (a generic plan, made before the parameters are known):
-- "tenant = $1 OR $1 IS NULL" can use no index on tenant, so each case has
-- its own branch, gated on $1 alone, which the plan checks once: the
-- branch whose gate is false is never run. Without $1 the primary key is
-- read backwards from the bound; with it the runs_tenant_pk index
-- (tenant, pk DESC) serves the same order within the tenant. The bound is
-- a coalesce, not "$5 IS NULL OR", so that it stays an index condition in
-- either plan. There is no ORDER BY over the union, which would only sort
-- the one branch's rows again (and read its whole stretch to do it): the
-- branch's rows come in its order, and the caller orders them by pk.
--
-- The runs are read as they show (runs_seen: a run whose task a worker
-- holds is running, with that attempt counted), and the status filter is
-- on the status they show.
SELECT s.*
FROM ((SELECT r.pk, r.id, r.tenant, r.name, r.queue, r.fairness_key, r.quota_key, r.priority,
              r.status, r.attempts, r.created_at, r.claimed_at, r.finished_at,
              NULL::jsonb AS output, NULL::text AS error,
              row_number() OVER (ORDER BY r.pk DESC) AS seen,
              ($2::text IS NULL OR r.queue = $2::text)
                AND ($3::text IS NULL OR r.name = $3::text)
                AND ($4::text[] IS NULL OR r.status = ANY ($4::text[])) AS matched
       FROM runs_seen r
       WHERE $1::text IS NULL
         AND r.pk < coalesce($5::bigint, 9223372036854775807)
         AND NOT EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk)
       ORDER BY r.pk DESC
       LIMIT $7)
      UNION ALL
      (SELECT r.pk, r.id, r.tenant, r.name, r.queue, r.fairness_key, r.quota_key, r.priority,
              r.status, r.attempts, r.created_at, r.claimed_at, r.finished_at,
              NULL::jsonb AS output, NULL::text AS error,
              row_number() OVER (ORDER BY r.pk DESC) AS seen,
              ($2::text IS NULL OR r.queue = $2::text)
                AND ($3::text IS NULL OR r.name = $3::text)
                AND ($4::text[] IS NULL OR r.status = ANY ($4::text[])) AS matched
       FROM runs_seen r
       WHERE $1::text IS NOT NULL
         AND r.tenant = $1::text
         AND r.pk < coalesce($5::bigint, 9223372036854775807)
         AND NOT EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk)
       ORDER BY r.pk DESC
       LIMIT $7)) AS s
WHERE s.matched OR s.seen = $7
LIMIT $6 + 1
