-- What one claim of key p_key charges it, read in one place for the single
-- claim (harvest_claim_step, then harvest_charge) and for the lone and bulk
-- steps of a batch (harvest_claim_lone, harvest_claim_bulk_fair):
--   weight: the key's override, 1 without one (the default key always
--     weighs 1: it can have no override);
--   cost: 1 per claim, or in a queue charged by runtime (p_runtime) the
--     key's held estimate in seconds (1 until one of its attempts has
--     ended, or for a key without state);
--   step: cost / weight, how far a claim moves the key's pass beyond its
--     start tag (harvest_start_tag). Successive claims of a key start at
--     t, t + step, t + step + step, ... (the running sum, in that order).
-- Both are read at the claim, so a change of weight applies at the key's
-- next claim. The caller holds the queue's fair lock, so the estimate
-- cannot move under it.
--
-- A set-returning LANGUAGE sql STABLE function without a SET clause, so
-- the planner inlines it into the statement that reads it (in the bulk
-- step, a lateral subquery per candidate key) instead of running it as a
-- function per row. The inner query is kept from being pulled up
-- (OFFSET 0) so that each read runs once, and the estimate is read only
-- for a runtime queue.
CREATE OR REPLACE FUNCTION harvest_charge_terms(p_queue text, p_key text, p_runtime boolean)
RETURNS TABLE (weight double precision, cost double precision, step double precision)
LANGUAGE sql STABLE
AS $$
    SELECT k.weight, k.cost, k.cost / k.weight
    FROM (SELECT coalesce((SELECT w.weight FROM weight_overrides w
                           WHERE p_key <> '' AND w.queue = p_queue AND w.key = p_key), 1::double precision) AS weight,
                 CASE WHEN p_runtime THEN coalesce((SELECT f.held_est FROM fair_state f
                                                    WHERE f.queue = p_queue AND f.key = p_key
                                                      AND f.charged_at IS NOT NULL), 1::double precision)
                      ELSE 1::double precision END AS cost
          OFFSET 0) k
$$;
