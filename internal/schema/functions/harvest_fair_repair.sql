-- Rebuild the key heads of one queue from the task rows, under the queue's
-- fair lock, so claims may go on meanwhile (they wait for it, as for any
-- fair claim). repaired counts the keys whose head was missing or came
-- after their true first row: what a bulk load with the triggers off or a
-- hand edit leaves, and the only faults a fair claim cannot find by
-- itself. refreshed counts heads that pointed at rows no longer pending,
-- which claims would have fixed when they met them.
-- The keys with pending rows are found by a loose scan of the key index,
-- one descent per key, so the cost follows the keys, not the backlog.
CREATE OR REPLACE FUNCTION harvest_fair_repair(p_queue text, OUT repaired integer, OUT refreshed integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM harvest_queue_lock(p_queue);
    PERFORM harvest_fair_fold(p_queue);
    WITH RECURSIVE k(key) AS (
        (SELECT x.fairness_key FROM tasks x
         WHERE x.queue = p_queue AND x.state = 'pending'
         ORDER BY x.fairness_key LIMIT 1)
        UNION ALL
        SELECT (SELECT x.fairness_key FROM tasks x
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.fairness_key > k.key
                ORDER BY x.fairness_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    ), t AS (
        SELECT k.key, h.id AS head_id, h.priority AS head_prio, h.continuation AS head_cont, h.due_at AS head_due
        FROM k CROSS JOIN LATERAL (
            SELECT x.id, x.priority, x.continuation, x.due_at FROM tasks x
            WHERE x.queue = p_queue AND x.fairness_key = k.key AND x.state = 'pending'
            ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
            LIMIT 1) h
        WHERE k.key IS NOT NULL
    ), judged AS (
        SELECT f.key IS NULL OR f.head_id IS NULL
                   OR harvest_beats(t.head_prio, t.head_cont, t.head_due, t.head_id,
                                    f.head_prio, f.head_cont, f.head_due, f.head_id) AS wrong,
               (t.head_id, t.head_prio, t.head_cont, t.head_due)
                   IS DISTINCT FROM (f.head_id, f.head_prio, f.head_cont, f.head_due) AS changed
        FROM t LEFT JOIN fair_state f ON f.queue = p_queue AND f.key = t.key
    ), up AS (
        INSERT INTO fair_state AS s (queue, key, head_id, head_prio, head_cont, head_due)
        SELECT p_queue, t.key, t.head_id, t.head_prio, t.head_cont, t.head_due FROM t
        ORDER BY t.key
        ON CONFLICT (queue, key) DO UPDATE SET
            head_id = excluded.head_id, head_prio = excluded.head_prio,
            head_cont = excluded.head_cont, head_due = excluded.head_due
        WHERE (s.head_id, s.head_prio, s.head_cont, s.head_due)
              IS DISTINCT FROM (excluded.head_id, excluded.head_prio, excluded.head_cont, excluded.head_due)
    ), cleared AS (
        UPDATE fair_state f SET head_id = NULL, head_prio = NULL, head_cont = NULL, head_due = NULL
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM t WHERE t.key = f.key)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM judged WHERE wrong),
           (SELECT count(*) FROM judged WHERE changed AND NOT wrong) + (SELECT count(*) FROM cleared)
    INTO repaired, refreshed;
END
$$;
