-- Lock the rows a bulk step planned (p_ids, in any order, with the key,
-- band and due time each had when it was read) and return the ids of
-- those still pending where the plan read them, in queue p_queue at
-- priority p_prio; a row that left the pending state or moved is not
-- returned. Rows are locked in id order, the order every claim locks task
-- rows in. p_skip: skip a row another transaction holds instead of waiting
-- for it (the two-level step, once it holds quota rows).
--
-- The rows are found by id alone and compared once locked. A join on the
-- other columns let the generic plan go through the queue's pending rows
-- (tasks_pending_key) whenever the statistics made a queue look small, as
-- on a table never analyzed: every bulk step then read the whole backlog
-- to lock a few rows. OFFSET 0 keeps the planner from pushing the
-- comparisons back into the locking scan. A row that no longer matches is
-- locked all the same, and left untouched until the commit.
CREATE OR REPLACE FUNCTION harvest_rows_lock(p_queue text, p_prio integer, p_ids bigint[], p_keys text[],
                                             p_conts boolean[], p_dues timestamptz[], p_skip boolean)
RETURNS bigint[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- A generic plan is made once per connection, with the statistics of that
-- moment: made on a shard of a few hundred tasks it read the ids by a
-- sequential scan of tasks, and kept doing so as the table grew until a
-- vacuum or analyze made it again; the claim's entry points, which this
-- runs under, now rule sequential scans out (harvest_claim_batch,
-- TestClaimPlansOutliveTheShardsGrowth).
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    -- SKIP LOCKED is part of the statement, not a value: two statements.
    IF p_skip THEN
        SELECT array_agg(x.id) INTO v_ids FROM (
            SELECT t.id, t.state, t.queue, t.fairness_key, t.priority, t.continuation, t.due_at FROM tasks t
            WHERE t.id = ANY (p_ids)
            ORDER BY t.id OFFSET 0 FOR UPDATE OF t SKIP LOCKED) x
        JOIN unnest(p_ids, p_keys, p_conts, p_dues) AS p(id, key, cont, due) ON p.id = x.id
        WHERE (x.state, x.queue, x.fairness_key, x.priority, x.continuation, x.due_at)
              = ('pending', p_queue, p.key, p_prio, p.cont, p.due);
    ELSE
        SELECT array_agg(x.id) INTO v_ids FROM (
            SELECT t.id, t.state, t.queue, t.fairness_key, t.priority, t.continuation, t.due_at FROM tasks t
            WHERE t.id = ANY (p_ids)
            ORDER BY t.id OFFSET 0 FOR UPDATE OF t) x
        JOIN unnest(p_ids, p_keys, p_conts, p_dues) AS p(id, key, cont, due) ON p.id = x.id
        WHERE (x.state, x.queue, x.fairness_key, x.priority, x.continuation, x.due_at)
              = ('pending', p_queue, p.key, p_prio, p.cont, p.due);
    END IF;
    RETURN v_ids;
END
$$;
