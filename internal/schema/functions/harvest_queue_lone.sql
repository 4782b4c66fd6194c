-- The one key of a queue whose fair batches may claim side by side
-- (harvest_claim_lone), or NULL when the queue needs the single claim's
-- order. That is so when exactly one key has a head (with one key there is
-- no order between keys to keep), no arrival waits to be folded, no
-- scheduled row is due (a lone claim promotes none), no ended attempt
-- waits to be settled (fair_held: a lone claim folds none; a queue charged
-- per claim has such rows after a switch from runtime, from the attempts
-- billed before it) and the queue has no quota (its rows are then claimed
-- without rechecks, as the single claim claims them).
CREATE OR REPLACE FUNCTION harvest_queue_lone(p_queue text, p_now timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_keys text[];
BEGIN
    SELECT array_agg(DISTINCT k.key) INTO v_keys FROM (
        (SELECT key FROM fair_state WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt LIMIT 2)
        UNION ALL
        (SELECT key FROM fair_state WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt LIMIT 2)) k;
    IF cardinality(v_keys) = 1
       AND NOT EXISTS (SELECT 1 FROM fair_arrivals WHERE queue = p_queue)
       AND NOT EXISTS (SELECT 1 FROM fair_held WHERE queue = p_queue)
       -- The first due entry of the scheduled index, read in its order
       -- so that no plan scans the table for it (harvest_queue_pending).
       AND (SELECT x.due_at FROM tasks x WHERE x.queue = p_queue AND x.state = 'scheduled' AND x.due_at <= p_now
            ORDER BY x.due_at LIMIT 1) IS NULL
       AND NOT EXISTS (SELECT 1 FROM quotas q WHERE q.queue = p_queue) THEN
        RETURN v_keys[1];
    END IF;
    RETURN NULL;
END
$$;
