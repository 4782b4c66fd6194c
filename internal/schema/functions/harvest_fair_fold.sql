-- Fold the queue's arrivals into its key heads. The caller holds the
-- queue's fair lock, so no other transaction deletes these rows or writes
-- these heads meanwhile; arrivals of transactions that have not committed
-- are not visible and stay for a later fold. A head only ever moves to a
-- row that comes first. Returns how many heads changed.
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
    )
    INSERT INTO fair_state AS s (queue, key, head_id, head_prio, head_cont, head_due)
    SELECT p_queue, b.key, b.head_id, b.head_prio, b.head_cont, b.head_due FROM best b
    ORDER BY b.key
    ON CONFLICT (queue, key) DO UPDATE SET
        head_id = excluded.head_id, head_prio = excluded.head_prio,
        head_cont = excluded.head_cont, head_due = excluded.head_due
    WHERE harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id,
                        s.head_prio, s.head_cont, s.head_due, s.head_id);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
