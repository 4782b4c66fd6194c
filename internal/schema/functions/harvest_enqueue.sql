-- Insert one task: the single-row insert path (claim.Enqueue, and the
-- continuation of a run). A row due later than now waits in the scheduled
-- state. p_now NULL means the database clock. PL/pgSQL keeps the plan of
-- the insert for the session; a SQL function would be planned every call.
CREATE OR REPLACE FUNCTION harvest_enqueue(p_run_pk bigint, p_queue text, p_key text, p_quota_key text,
                                           p_priority integer, p_continuation boolean, p_due timestamptz,
                                           p_sticky_worker text, p_sticky_until timestamptz, p_step integer,
                                           p_input jsonb, p_trace jsonb, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_due timestamptz := coalesce(p_due, coalesce(p_now, now()));
    v_id  bigint;
BEGIN
    INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                       sticky_worker, sticky_until, step, input, trace_context)
    VALUES (p_run_pk, p_queue, p_key, p_quota_key, p_priority, p_continuation,
            CASE WHEN v_due <= v_now THEN 'pending' ELSE 'scheduled' END,
            v_due, p_sticky_worker, p_sticky_until, p_step, p_input, p_trace)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
