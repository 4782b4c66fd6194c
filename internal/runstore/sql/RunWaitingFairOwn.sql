-- The fair order's inputs about the run's own task in queue $1: the
-- queue's clock V, the pass and weight of its key $2, how many due pending
-- tasks of the key at its priority $3 come before it in the key's order
-- (continuation first, then due_at, then id: $4, $5, $6), and how many due
-- pending tasks of the queue have a higher priority. Counts stop at $7.
SELECT coalesce((SELECT c.clock FROM fair_queues c WHERE c.queue = $1), 0)::double precision AS clock,
       (SELECT f.pass FROM fair_state f
        WHERE f.queue = $1 AND f.key = $2 AND f.charged_at IS NOT NULL) AS pass,
       coalesce((SELECT w.weight FROM weight_overrides w WHERE w.queue = $1 AND w.key = $2), 1)::double precision AS weight,
       (SELECT count(*) FROM (
            SELECT 1 FROM tasks y
            WHERE y.queue = $1 AND y.fairness_key = $2 AND y.state = 'pending' AND y.due_at <= now()
              AND y.priority = $3
              AND (NOT y.continuation, y.due_at, y.id) < (NOT $4::boolean, $5::timestamptz, $6::bigint)
            LIMIT $7) s) AS own_ahead,
       (SELECT count(*) FROM (
            SELECT 1 FROM tasks y
            WHERE y.queue = $1 AND y.state = 'pending' AND y.due_at <= now() AND y.priority > $3
            LIMIT $7) s) AS higher_ahead
