-- Delete rate buckets untouched for $1 microseconds that have refilled to
-- their burst (or whose quota has no rate any more). A missing bucket starts
-- full, so deleting a full one changes no claim's outcome.
WITH gone AS (
    DELETE FROM rate_buckets b
    WHERE b.updated_at <= now() - $1::bigint * interval '1 microsecond'
      AND NOT EXISTS (
          SELECT 1 FROM quotas q
          WHERE q.queue = b.queue AND q.quota_key = b.quota_key AND q.rate IS NOT NULL
            AND b.tokens + q.rate * extract(epoch FROM now() - b.updated_at) < q.burst)
    RETURNING 1
)
SELECT count(*) FROM gone
