-- Prune the fairness state of one queue. A row goes when its key has no
-- pending or scheduled task in the queue, it was last charged at or before
-- p_now - p_window (or never), and it is not the clock row (greatest
-- (last_start, key) of the queue, compared bytewise), so V never falls in
-- a live queue. A queue with no pending or scheduled task and no charge
-- inside the window loses all its rows. Returns the rows with fairness
-- state deleted; rows that only held a head go silently.
--
-- A two-level queue keeps every row until it is idle: a group's key clock
-- is the largest start of its keys, and pruning one would have to find the
-- next. An idle queue loses its group rows with its key rows.
--
-- The real prune holds the queue's fair lock. With p_preview the same
-- statement runs on a temporary copy of the queue's rows and takes no lock,
-- so a claim never waits for a preview. p_now NULL means the database clock.
CREATE OR REPLACE FUNCTION harvest_fair_prune(p_queue text, p_now timestamptz, p_window interval, p_preview boolean)
RETURNS TABLE (queue text, key text)
LANGUAGE plpgsql AS $$
DECLARE
    v_target text := 'public.fair_state';
    v_idle   boolean;
BEGIN
    p_now := coalesce(p_now, now());
    IF NOT p_preview THEN
        PERFORM harvest_queue_lock(p_queue);
    END IF;
    -- Pending and scheduled rows are probed apart: each state has its own
    -- partial index, and "state IN (both)" matches neither, which made
    -- every probe a scan of the queue's tasks under the fair lock.
    v_idle := coalesce((SELECT max(g.charged_at) FROM fair_state g WHERE g.queue = p_queue), '-infinity') <= p_now - p_window
              AND NOT harvest_queue_pending(p_queue)
              AND (SELECT x.due_at FROM tasks x WHERE x.queue = p_queue AND x.state = 'scheduled'
                   ORDER BY x.due_at LIMIT 1) IS NULL;
    IF NOT v_idle AND (SELECT m.two_level FROM harvest_fair_mode(p_queue) m) THEN
        RETURN;
    END IF;
    IF p_preview THEN
        IF to_regclass('pg_temp.harvest_prune_preview') IS NOT NULL THEN
            DROP TABLE pg_temp.harvest_prune_preview;
        END IF;
        CREATE TEMP TABLE harvest_prune_preview ON COMMIT DROP AS
            SELECT * FROM fair_state f WHERE f.queue = p_queue;
        v_target := 'pg_temp.harvest_prune_preview';
    END IF;
    -- The clock row is found by reading the queue's rows: prune is rare,
    -- and an index on last_start would be rewritten by every charge.
    RETURN QUERY EXECUTE format($q$
        WITH clock AS (
            SELECT c.key FROM %1$s c
            WHERE c.queue = $3 AND c.charged_at IS NOT NULL
            ORDER BY c.last_start DESC, c.key COLLATE "C" DESC
            LIMIT 1
        ), idle AS (
            SELECT coalesce((SELECT max(g.charged_at) FROM %1$s g WHERE g.queue = $3), '-infinity') <= $1 - $2
               AND NOT harvest_queue_pending($3)
               AND (SELECT x.due_at FROM tasks x WHERE x.queue = $3 AND x.state = 'scheduled'
                    ORDER BY x.due_at LIMIT 1) IS NULL AS yes
        ), gone AS (
            DELETE FROM %1$s s
            WHERE s.queue = $3
              AND ((SELECT yes FROM idle)
                   OR ((s.charged_at IS NULL OR s.charged_at <= $1 - $2)
                       AND NOT EXISTS (SELECT 1 FROM tasks x
                                       WHERE x.queue = s.queue AND x.fairness_key = s.key AND x.state = 'pending')
                       AND NOT EXISTS (SELECT 1 FROM tasks x
                                       WHERE x.queue = s.queue AND x.fairness_key = s.key AND x.state = 'scheduled')
                       AND s.key IS DISTINCT FROM (SELECT c.key FROM clock c)))
            RETURNING s.queue, s.key, s.charged_at
        )
        SELECT gone.queue, gone.key FROM gone WHERE gone.charged_at IS NOT NULL
        ORDER BY gone.key COLLATE "C" $q$, v_target)
    USING p_now, p_window, p_queue;
    -- An idle queue lost every row: its clock starts over.
    IF NOT p_preview AND NOT EXISTS (SELECT 1 FROM fair_state f WHERE f.queue = p_queue AND f.charged_at IS NOT NULL) THEN
        DELETE FROM fair_queues q WHERE q.queue = p_queue;
    END IF;
    IF NOT p_preview AND v_idle THEN
        DELETE FROM fair_groups g WHERE g.queue = p_queue;
    END IF;
END
$$;
