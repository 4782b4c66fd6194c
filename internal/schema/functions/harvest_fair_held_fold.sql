-- Settle the worker time of the queue's ended attempts (fair_held) into
-- its fairness state: each key's pass moves by (held - billed) / w, the
-- difference between what its attempts held and what their claims billed
-- up front, so in all a key pays held / w; its estimate (held_est) moves a
-- quarter of the way to the mean held time of the attempts folded. In a
-- two-level queue (p_two_level) the group's pass moves by the same
-- seconds over the group's weight. Time of a key without fairness state
-- (pruned while its task ran) is dropped, as the prune forgives a debt.
-- The caller holds the queue's fair lock. Sums run in the order the
-- attempts ended (fair_held.id), so the result is exact to the bit against
-- the reference model.
CREATE OR REPLACE FUNCTION harvest_fair_held_fold(p_queue text, p_two_level boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    -- One statement: every data-modifying part of it runs to completion
    -- whether or not the final select reads it.
    WITH gone AS (
        DELETE FROM fair_held h WHERE h.queue = p_queue RETURNING h.id, h.key, h.secs, h.billed
    ), k AS (
        SELECT g.key, sum(g.secs - g.billed ORDER BY g.id) AS delta,
               sum(g.secs ORDER BY g.id) / count(*) AS mean
        FROM gone g GROUP BY g.key
    ), keys AS (
        UPDATE fair_state s SET
            pass     = s.pass + k.delta / coalesce(w.weight, 1),
            held_est = CASE WHEN s.held_est IS NULL THEN k.mean ELSE s.held_est + (k.mean - s.held_est) * 0.25 END,
            in_debt  = s.pass + k.delta / coalesce(w.weight, 1) > harvest_clock(p_queue)
        FROM k LEFT JOIN weight_overrides w ON w.queue = p_queue AND w.key = k.key
        WHERE s.queue = p_queue AND s.key = k.key AND s.pass IS NOT NULL
        RETURNING 1
    ), gr AS (
        SELECT split_part(g.key, '/', 1) AS grp, sum(g.secs - g.billed ORDER BY g.id) AS delta
        FROM gone g WHERE p_two_level GROUP BY split_part(g.key, '/', 1)
    ), groups AS (
        UPDATE fair_groups f SET pass = f.pass + gr.delta / coalesce(w.weight, 1)
        FROM gr LEFT JOIN group_weights w ON w.queue = p_queue AND w.grp = gr.grp
        WHERE f.queue = p_queue AND f.grp = gr.grp AND f.pass IS NOT NULL
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$$;
