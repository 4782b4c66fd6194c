-- Charge a key for an accepted fair claim of row p_took, with p_clock the
-- queue clock V: start = max(pass, V) (V for a key without state),
-- last_start = start, pass = start + 1/w, with w the key's override (1
-- without one; the default key always weighs 1), read now, so a weight
-- change applies at the key's next claim. When p_took was the key's head,
-- the head moves on to the key's next pending row in the same update. When
-- the clock moves, every key it caught up with loses its debt mark, so
-- in_debt stays exactly pass > V. Returns the new clock. The caller holds
-- the queue's fair lock.
CREATE OR REPLACE FUNCTION harvest_charge(p_queue text, p_key text, p_now timestamptz, p_took bigint,
                                          p_clock double precision) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    v_w     double precision;
    v_start double precision;
    r_f     fair_state%ROWTYPE;
    r_head  record;
BEGIN
    IF p_key <> '' THEN
        SELECT weight INTO v_w FROM weight_overrides WHERE queue = p_queue AND key = p_key;
    END IF;
    v_w := coalesce(v_w, 1);
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key;
    IF NOT FOUND THEN
        -- A key whose arrival was never folded (its state was lost): its
        -- head is read from the index.
        SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, NULL, NULL, NULL, NULL);
        v_start := p_clock;
        INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt,
                                head_id, head_prio, head_cont, head_due)
        VALUES (p_queue, p_key, v_start + 1::double precision / v_w, v_start, p_now, true,
                r_head.head_id, r_head.head_prio, r_head.head_cont, r_head.head_due);
    ELSE
        v_start := CASE WHEN r_f.pass IS NULL THEN p_clock ELSE greatest(r_f.pass, p_clock) END;
        IF r_f.head_id = p_took THEN
            SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, r_f.head_prio, r_f.head_cont,
                                                       r_f.head_due, r_f.head_id);
            UPDATE fair_state SET
                last_start = v_start,
                pass       = v_start + 1::double precision / v_w,
                charged_at = p_now,
                in_debt    = true,
                head_id    = r_head.head_id,
                head_prio  = r_head.head_prio,
                head_cont  = r_head.head_cont,
                head_due   = r_head.head_due
            WHERE queue = p_queue AND key = p_key;
        ELSE
            UPDATE fair_state SET
                last_start = v_start,
                pass       = v_start + 1::double precision / v_w,
                charged_at = p_now,
                in_debt    = true
            WHERE queue = p_queue AND key = p_key;
        END IF;
    END IF;
    IF v_start > p_clock THEN
        PERFORM harvest_clock_advance(p_queue, v_start);
    END IF;
    RETURN greatest(v_start, p_clock);
END
$$;
