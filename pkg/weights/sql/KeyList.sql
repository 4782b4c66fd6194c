-- The per-key view of queue $1: every key with fairness state, due pending
-- work, an override or a claim since $2 (NULL: one minute ago on the
-- database clock; counted through the index tasks_claimed_at), at most $3
-- keys in byte order, each row carrying the queue clock V. Pending rows are
-- counted from the key index (the summary holds heads, not counts). With
-- $4 set, only the keys bound to tenant $4: the key $4 and those under
-- '$4/'.
WITH v AS (
    SELECT harvest_clock($1) AS clock
), waiting AS (
    SELECT x.fairness_key AS key, count(*) AS n FROM tasks x
    WHERE x.queue = $1 AND x.state = 'pending'
    GROUP BY x.fairness_key
), recent AS (
    SELECT x.fairness_key AS key, count(*) AS n FROM tasks x
    WHERE x.queue = $1 AND x.claimed_at IS NOT NULL AND x.claimed_at >= coalesce($2::timestamptz, now() - interval '1 minute')
    GROUP BY x.fairness_key
), keys AS (
    SELECT f.key FROM fair_state f WHERE f.queue = $1
    UNION
    SELECT p.key FROM waiting p
    UNION
    SELECT w.key FROM weight_overrides w WHERE w.queue = $1
    UNION
    SELECT r.key FROM recent r
)
SELECT k.key,
       w.weight,
       f.pass,
       f.charged_at,
       CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, v.clock) - v.clock END AS lag,
       coalesce(p.n, 0) AS pending,
       coalesce(r.n, 0) AS claims,
       v.clock
FROM keys k
CROSS JOIN v
LEFT JOIN fair_state f ON f.queue = $1 AND f.key = k.key
LEFT JOIN weight_overrides w ON w.queue = $1 AND w.key = k.key
LEFT JOIN recent r ON r.key = k.key
LEFT JOIN waiting p ON p.key = k.key
-- (the rule of fairkeys.BoundTo)
WHERE $4::text IS NULL OR k.key = $4::text OR starts_with(k.key, $4::text || '/')
ORDER BY k.key COLLATE "C"
LIMIT $3
