-- One shard's part of a console page of runs, newest first: the runs
-- after the cursor position ($5 created_at, $6 pk: rows before it in the
-- order created_at DESC, pk DESC; NULL $5 starts at the newest), with the
-- filters $1 tenant, $2 queue, $3 workflow name and $4 statuses (NULL: no
-- filter), at most $7 rows. Runs a tenant move is copying away (move_out)
-- are left out, their copy on the new home is listed instead.
-- With $1 set the runs_tenant_pk index finds the tenant's runs; there is
-- no index by creation time, so the order is a top-N sort of the rows the
-- filters keep (pk order is not creation order: a start's created_at is its
-- transaction's start, and a moved run keeps its time but gets a new pk).
SELECT r.pk, r.id, r.tenant, r.name, r.queue, r.fairness_key, r.quota_key, r.priority,
       r.status, r.attempts, r.created_at, r.claimed_at, r.finished_at, r.output, r.error
FROM runs r
WHERE ($1::text IS NULL OR r.tenant = $1::text)
  AND ($2::text IS NULL OR r.queue = $2::text)
  AND ($3::text IS NULL OR r.name = $3::text)
  AND ($4::text[] IS NULL OR r.status = ANY ($4::text[]))
  AND ($5::timestamptz IS NULL OR (r.created_at, r.pk) < ($5::timestamptz, $6::bigint))
  AND NOT EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk)
ORDER BY r.created_at DESC, r.pk DESC
LIMIT $7
