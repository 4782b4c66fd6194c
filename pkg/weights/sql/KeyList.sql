-- The per-key view of queue $1: every key with fairness state, due pending
-- work, an override or a claim since $2 (NULL: one minute ago on the
-- database clock; counted through the index tasks_claimed_at), at most $3
-- keys in byte order, each row carrying the queue clock V. Pending rows are
-- counted from the key index (the summary holds heads, not counts). With
-- $4 set, only the keys bound to tenant $4: the key $4 and those under
-- '$4/'.
--
-- Counting every key's pending rows reads the queue's whole backlog, so
-- only the operator's view (no $4) has to; a tenant's view first walks the
-- keys with pending rows by a loose scan of the key index (one descent per
-- key, as harvest_fair_repair does) and counts the rows of its own keys
-- alone: another tenant's flood costs it one descent, not a read of every
-- row. (Keys under '$4/' need not be neighbours in the index's collation,
-- so the walk visits every key rather than a range.) A descent costs more
-- than an entry read in order, so a queue of many keys with a few rows
-- each is cheaper to count whole: past 1,000 keys the walk stops and the
-- tenant's view counts the queue's rows as the operator's does. Each half
-- is gated on a value computed once, so a generic plan runs one of them.
WITH RECURSIVE v AS (
    SELECT harvest_clock($1) AS clock
), pending_keys(key, depth) AS (
    (SELECT x.fairness_key, 1 FROM tasks x
     WHERE $4::text IS NOT NULL AND x.queue = $1 AND x.state = 'pending'
     ORDER BY x.fairness_key LIMIT 1)
    UNION ALL
    SELECT (SELECT x.fairness_key FROM tasks x
            WHERE x.queue = $1 AND x.state = 'pending' AND x.fairness_key > k.key
            ORDER BY x.fairness_key LIMIT 1),
           k.depth + 1
    FROM pending_keys k WHERE k.key IS NOT NULL AND k.depth <= 1000
), walk AS (
    -- Whether the walk reached the end of the keys (its last row is the
    -- NULL after the last key); also true when there was nothing to walk.
    SELECT coalesce(bool_or(k.key IS NULL), true) AS whole FROM pending_keys k
), waiting AS (
    SELECT x.fairness_key AS key, count(*) AS n FROM tasks x
    WHERE ($4::text IS NULL OR NOT (SELECT w.whole FROM walk w)) AND x.queue = $1 AND x.state = 'pending'
    GROUP BY x.fairness_key
    UNION ALL
    SELECT k.key, c.n FROM pending_keys k
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM tasks x
                        WHERE x.queue = $1 AND x.fairness_key = k.key AND x.state = 'pending') c
    WHERE $4::text IS NOT NULL AND (SELECT w.whole FROM walk w)
      AND k.key IS NOT NULL AND (k.key = $4::text OR starts_with(k.key, $4::text || '/'))
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
