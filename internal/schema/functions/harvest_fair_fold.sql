-- Fold the queue's arrivals into its key heads. The caller holds the
-- queue's fair lock, so no other transaction deletes these rows or writes
-- these heads meanwhile; arrivals of transactions that have not committed
-- are not visible and stay for a later fold. A head only ever moves to a
-- row that comes first. Returns how many heads changed.
--
-- An arrival can name a row that is no longer pending: a claim statement
-- folds once, at its start, and its later statements see rows committed
-- since (a row pinned to the worker, a named claim, a bulk step reading
-- past a head), so a row can be taken before its arrival is folded; so can
-- an ordinary claim, which does not fold at all. Such an arrival stands
-- for the key's first pending row from its place on (harvest_key_head):
-- folding the taken row itself would leave a head no claim can take, and
-- every fair bulk step would stop at that key until a single claim
-- repaired it. A key new to the queue gets its state row all the same,
-- without a head when none of its rows is pending: the key has been seen
-- (the console lists it, the prune drops it once idle).
CREATE OR REPLACE FUNCTION harvest_fair_fold(p_queue text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    WITH gone AS (
        DELETE FROM fair_arrivals WHERE queue = p_queue
        RETURNING key, head_id, head_prio, head_cont, head_due
    ), best AS (
        SELECT DISTINCT ON (key) key, head_id, head_prio, head_cont, head_due FROM gone
        ORDER BY key, head_prio DESC, head_cont DESC, head_due, head_id
    ), seen AS (
        -- Whether each arrival's row is still pending where it said. The
        -- row is found by its id alone, and the rest compared after, so
        -- that no plan reads a queue's pending rows to find it; and each
        -- by a probe of its own (OFFSET 0 keeps the subquery apart), as a
        -- join let the plan cached on a small shard merge the arrivals
        -- with a scan of the whole primary key.
        SELECT b.*, coalesce(t.state = 'pending' AND t.queue = p_queue AND t.fairness_key = b.key
                             AND t.priority = b.head_prio AND t.continuation = b.head_cont
                             AND t.due_at = b.head_due, false) AS pending
        FROM best b
        LEFT JOIN LATERAL (SELECT x.state, x.queue, x.fairness_key, x.priority, x.continuation, x.due_at
                           FROM tasks x WHERE x.id = b.head_id OFFSET 0) t ON true
    ), live AS (
        SELECT s.key, s.head_id, s.head_prio, s.head_cont, s.head_due FROM seen s WHERE s.pending
        UNION ALL
        SELECT s.key, k.head_id, k.head_prio, k.head_cont, k.head_due
        FROM seen s
        CROSS JOIN LATERAL harvest_key_head(p_queue, s.key, s.head_prio, s.head_cont, s.head_due, s.head_id) k
        WHERE NOT s.pending
    )
    INSERT INTO fair_state AS s (queue, key, head_id, head_prio, head_cont, head_due)
    SELECT p_queue, l.key, l.head_id, l.head_prio, l.head_cont, l.head_due FROM live l
    ORDER BY l.key
    ON CONFLICT (queue, key) DO UPDATE SET
        head_id = excluded.head_id, head_prio = excluded.head_prio,
        head_cont = excluded.head_cont, head_due = excluded.head_due
    WHERE excluded.head_id IS NOT NULL
      AND harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id,
                        s.head_prio, s.head_cont, s.head_due, s.head_id);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
