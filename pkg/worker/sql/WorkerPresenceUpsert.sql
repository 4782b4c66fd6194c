-- Announce that worker $1 claims from the queues $2 (fair order when $3)
-- and counts as live until $4 microseconds from now, by the database
-- clock, so that workers with skewed clocks agree with the readers
-- (internal/runstore's Waiting). The same statement deletes the rows of
-- workers gone for an hour (a crash leaves its rows), so the table holds
-- the live fleet and little more.
WITH gone AS (
    DELETE FROM worker_presence WHERE live_until < now() - interval '1 hour' AND worker <> $1
)
INSERT INTO worker_presence AS p (worker, queue, fair, seen_at, live_until)
SELECT $1, q, $3, now(), now() + $4::bigint * interval '1 microsecond'
FROM unnest($2::text[]) AS q
ON CONFLICT (worker, queue) DO UPDATE
SET fair = EXCLUDED.fair, seen_at = EXCLUDED.seen_at, live_until = EXCLUDED.live_until
