-- Record one outcome through harvest_outcome_batch (see there for p_kind
-- and the other arguments), raising when it was not recorded: HA001 when
-- the lease token is not the task's current one, HA002 when there is no
-- such task (the codes of harvest_leased). The single-task functions
-- (harvest_complete, harvest_continue, harvest_fail) are this, so that a
-- task recorded alone and one recorded in a batch end the same way.
CREATE OR REPLACE FUNCTION harvest_outcome_one(p_kind text, p_id bigint, p_token uuid, p_value jsonb, p_error text,
                                               p_retry_at timestamptz, p_due timestamptz,
                                               p_sticky_until timestamptz, p_now timestamptz,
                                               OUT retried boolean, OUT next_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
BEGIN
    SELECT b.outcome, b.retried, b.next_id INTO v_outcome, retried, next_id
    FROM harvest_outcome_batch(ARRAY[p_kind], ARRAY[p_id], ARRAY[p_token], ARRAY[p_value], ARRAY[p_error],
                               ARRAY[p_retry_at], ARRAY[p_due], ARRAY[p_sticky_until], p_now) AS b;
    IF v_outcome = 'not_found' THEN
        RAISE EXCEPTION 'task % not found', p_id USING ERRCODE = 'HA002';
    END IF;
    IF v_outcome IS DISTINCT FROM 'ok' THEN
        RAISE EXCEPTION 'task %: lease token is not current', p_id USING ERRCODE = 'HA001';
    END IF;
END
$$;
