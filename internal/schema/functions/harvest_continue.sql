-- Finish this task and enqueue the run's next one in the continuation band,
-- same queue and keys; optionally pinned to the worker that holds the lease
-- until p_sticky_until, and due at p_due. Returns the new task's id.
CREATE OR REPLACE FUNCTION harvest_continue(p_id bigint, p_token uuid, p_input jsonb, p_sticky_until timestamptz,
                                 p_due timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    r_task tasks%ROWTYPE := harvest_leased(p_id, p_token);
    v_id   bigint;
BEGIN
    UPDATE tasks SET state = 'done', lease_expires_at = NULL WHERE id = p_id;
    v_id := harvest_enqueue(r_task.run_pk, r_task.queue, r_task.fairness_key, r_task.quota_key,
                            r_task.priority, true, p_due,
                            CASE WHEN p_sticky_until IS NULL THEN NULL ELSE r_task.claimed_by END,
                            p_sticky_until, r_task.step + 1, p_input, r_task.trace_context, p_now);
    RETURN v_id;
END
$$;
