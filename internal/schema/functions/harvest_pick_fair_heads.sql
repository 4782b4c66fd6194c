-- The fair pick without ageing and without refusals, by the key heads: the
-- best key without debt (lag 0, compared by its head) from the index
-- fair_state_free against the best key in debt (head priority, then pass)
-- from fair_state_debt, one descent each; priority still comes first
-- across both. The chosen key's head is then taken or repaired
-- (harvest_head_check). The answer is the picks' (harvest_claim_step):
--   took and key_lag: the head, locked, and its key's lag;
--   redo = 'again': a debt mark the clock had passed was cleared, or a
--     stale head repaired; compare the keys again;
--   redo = 'sort': the head is not due at a caller-given time that went
--     back, or due work has no head at all (a lost summary): the full sort
--     (harvest_pick_fair_sort) serves it until a repair
--     (harvest_fair_repair) restores the summary;
--   nothing: the queue has no pending row.
CREATE OR REPLACE FUNCTION harvest_pick_fair_heads(p_queue text, p_due_cut timestamptz, p_clock double precision,
                                                   OUT took tasks, OUT cand bigint, OUT redo text,
                                                   OUT key_lag double precision)
LANGUAGE plpgsql AS $$
DECLARE
    r_a     fair_state%ROWTYPE;
    r_b     fair_state%ROWTYPE;
    r_k     fair_state%ROWTYPE;
    v_use_a boolean;
BEGIN
    SELECT * INTO r_a FROM fair_state
    WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt
    ORDER BY head_prio DESC, head_cont DESC, head_due, head_id
    LIMIT 1;
    SELECT * INTO r_b FROM fair_state
    WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt
    ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id
    LIMIT 1;
    IF r_b.key IS NOT NULL AND r_b.pass <= p_clock THEN
        PERFORM harvest_debt_clear(p_queue, p_clock);
        redo := 'again';
        RETURN;
    END IF;
    IF r_a.key IS NULL AND r_b.key IS NULL THEN
        IF harvest_queue_pending(p_queue) THEN
            redo := 'sort';
        END IF;
        RETURN;
    END IF;
    v_use_a := r_b.key IS NULL OR (r_a.key IS NOT NULL AND
        (-r_a.head_prio, 0::double precision, NOT r_a.head_cont, r_a.head_due, r_a.head_id)
        <= (-r_b.head_prio, harvest_lag(r_b.pass, p_clock), NOT r_b.head_cont, r_b.head_due, r_b.head_id));
    IF v_use_a THEN
        r_k := r_a;
    ELSE
        r_k := r_b;
    END IF;
    IF r_k.head_due > p_due_cut THEN
        redo := 'sort';
        RETURN;
    END IF;
    took := harvest_head_check(p_queue, r_k);
    IF took.id IS NULL THEN
        redo := 'again';
        RETURN;
    END IF;
    key_lag := CASE WHEN v_use_a THEN 0 ELSE harvest_lag(r_k.pass, p_clock) END;
END
$$;
