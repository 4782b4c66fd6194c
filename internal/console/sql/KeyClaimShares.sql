-- The claims of queue $1 per fairness key and time bucket on one shard:
-- $2 is the bucket in microseconds, $3 the number of buckets, so the
-- window is the last $2 * $3 microseconds up to now(); $4 is a tenant
-- ('' for none) whose bound keys alone are counted (the key itself and
-- the keys under "tenant/", as fairkeys.BoundTo). Bucket 0 is the oldest,
-- $3 - 1 ends at now(); each bucket is half-open at its old end. A task
-- counts once, at its latest claim. Read from tasks_claimed_at alone
-- (queue, claimed_at, fairness_key). One extra row with a NULL key
-- carries now(), so that a shard with no claims still gives its clock.
WITH claims AS (
    SELECT t.fairness_key AS key,
           -- A claim that committed after this statement's now() (its
           -- transaction started later) is counted in the newest bucket.
           $3::int - 1 - floor(greatest(0, extract(epoch FROM now() - t.claimed_at) * 1000000)
                               / $2::bigint)::int AS bucket
    FROM tasks t
    WHERE t.queue = $1::text
      AND t.claimed_at IS NOT NULL
      AND t.claimed_at > now() - ($2::bigint * $3::int) * interval '1 microsecond'
      AND ($4::text = '' OR t.fairness_key = $4::text OR starts_with(t.fairness_key, $4::text || '/'))
)
SELECT now() AS end_at, key, bucket, count(*) AS claims
FROM claims
GROUP BY key, bucket
UNION ALL
SELECT now(), NULL, NULL, 0
