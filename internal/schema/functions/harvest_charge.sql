-- Charge a key for an accepted fair claim of row p_took: start = max(pass,
-- V) (V for a key without state), last_start = start, pass = start + 1/w,
-- with w the key's override (1 without one; the default key always weighs
-- 1), read now, so a weight change applies at the key's next claim. When
-- p_took was the key's head, the head moves on to the key's next pending
-- row in the same update. Then every key the new clock caught up with
-- loses its debt mark, so in_debt stays exactly pass > V. The caller holds
-- the queue's fair lock.
CREATE OR REPLACE FUNCTION harvest_charge(p_queue text, p_key text, p_now timestamptz, p_took bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_clock double precision := harvest_clock(p_queue);
    v_w     double precision := 1;
    v_start double precision;
    r_f     fair_state%ROWTYPE;
    r_head  record;
BEGIN
    IF p_key <> '' THEN
        SELECT weight INTO v_w FROM weight_overrides WHERE queue = p_queue AND key = p_key;
        v_w := coalesce(v_w, 1);
    END IF;
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key;
    IF NOT FOUND THEN
        -- A key whose arrival was never folded (its summary was lost): its
        -- head is read from the index.
        SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, NULL, NULL, NULL, NULL);
        v_start := v_clock;
        INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt,
                                head_id, head_prio, head_cont, head_due)
        VALUES (p_queue, p_key, v_clock + 1::double precision / v_w, v_clock, p_now, true,
                r_head.head_id, r_head.head_prio, r_head.head_cont, r_head.head_due);
    ELSE
        v_start := CASE WHEN r_f.pass IS NULL THEN v_clock ELSE greatest(r_f.pass, v_clock) END;
        IF r_f.head_id = p_took THEN
            SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, r_f.head_prio, r_f.head_cont,
                                                       r_f.head_due, r_f.head_id);
        ELSE
            SELECT r_f.head_id, r_f.head_prio, r_f.head_cont, r_f.head_due INTO r_head;
        END IF;
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
    END IF;
    IF v_start > v_clock THEN
        UPDATE fair_state SET in_debt = false
        WHERE queue = p_queue AND in_debt AND pass <= v_start;
    END IF;
END
$$;
