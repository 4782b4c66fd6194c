-- Finish several leased tasks and their runs, each fenced by its lease
-- token: a task whose token is not current (or that is not running) is left
-- alone and reported 'stale', an unknown id 'not_found'; the others are
-- 'ok'. Answers come in the order of p_ids. A batch of completions only:
-- harvest_outcome_batch records them (and holds the lock order).
CREATE OR REPLACE FUNCTION harvest_complete_batch(p_ids bigint[], p_tokens uuid[], p_outputs jsonb[])
RETURNS TABLE (task_id bigint, outcome text)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_ids), 0);
BEGIN
    RETURN QUERY
        SELECT b.task_id, b.outcome
        FROM harvest_outcome_batch(array_fill('complete'::text, ARRAY[v_n]), p_ids, p_tokens, p_outputs,
                                   array_fill(NULL::text, ARRAY[v_n]), array_fill(NULL::timestamptz, ARRAY[v_n]),
                                   array_fill(NULL::timestamptz, ARRAY[v_n]), array_fill(NULL::timestamptz, ARRAY[v_n]),
                                   NULL) AS b;
END
$$;
