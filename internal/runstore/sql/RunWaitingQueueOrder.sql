-- In a queue claimed without fairness keys: how many due pending tasks of
-- queue $1 come before the task in the claim order (priority $2 first,
-- then continuation $3, due_at $4, id $5), counted up to $6.
SELECT count(*) AS ahead FROM (
    SELECT 1 FROM tasks y
    WHERE y.queue = $1 AND y.state = 'pending' AND y.due_at <= now()
      AND (-y.priority, NOT y.continuation, y.due_at, y.id) < (-$2::integer, NOT $3::boolean, $4::timestamptz, $5::bigint)
    LIMIT $6) s
