-- Clear the debt marks of a queue's keys whose pass the clock p_clock has
-- reached: such a key has no debt and must compete by its head, from
-- fair_state_free. Only a repair or a hand edit leaves such a mark behind
-- (the charge clears the marks the clock reaches); the picks that merge the
-- two key indexes call it when the best key in debt has one, and compare
-- the keys again (harvest_pick_fair_heads, harvest_pick_fair_rows).
CREATE OR REPLACE FUNCTION harvest_debt_clear(p_queue text, p_clock double precision) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fair_state SET in_debt = false
    WHERE queue = p_queue AND in_debt AND pass <= p_clock;
END
$$;
