-- The other keys of fair queue $1 with pending work (a key head in
-- fair_state, or an arrival not folded yet), but not the run's own key $2,
-- first the keys whose start tag max(pass, V) ($4 is V) is smallest, at
-- most $6 of them. For each: its pass and weight, whether it has a due
-- pending task above the run's priority $3, and its due pending tasks at
-- that priority, counted only up to the claims its start tag leaves it
-- before the run's start tag $5 (ceil((S - tag) * weight)), since no more
-- of them can be ahead.
WITH keys AS (
    SELECT f.key FROM fair_state f WHERE f.queue = $1 AND f.head_id IS NOT NULL AND f.key <> $2
    UNION
    SELECT a.key FROM fair_arrivals a WHERE a.queue = $1 AND a.key <> $2
), k AS (
    SELECT keys.key, f.pass, coalesce(w.weight, 1)::double precision AS weight,
           greatest(coalesce(f.pass, $4::double precision), $4::double precision) AS tag
    FROM keys
    LEFT JOIN fair_state f ON f.queue = $1 AND f.key = keys.key AND f.charged_at IS NOT NULL
    LEFT JOIN weight_overrides w ON w.queue = $1 AND w.key = keys.key
    ORDER BY tag, keys.key
    LIMIT $6
)
SELECT k.key, k.pass, k.weight,
       EXISTS (SELECT 1 FROM tasks y
               WHERE y.queue = $1 AND y.fairness_key = k.key AND y.state = 'pending' AND y.due_at <= now()
                 AND y.priority > $3) AS has_higher,
       (SELECT count(*) FROM (
            SELECT 1 FROM tasks y
            WHERE y.queue = $1 AND y.fairness_key = k.key AND y.state = 'pending' AND y.due_at <= now()
              AND y.priority = $3
            LIMIT greatest(0, ceil(($5::double precision - k.tag) * k.weight - 1e-9))::bigint) s) AS pending
FROM k
ORDER BY k.tag, k.key
