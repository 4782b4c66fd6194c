-- Replace the head of a key (p_head: its fair_state row as a pick read it,
-- under the queue's fair lock) that left the pending state or moved since
-- the summary named it (an ordinary claim, a cancel or an update took it)
-- by the key's true first row, read from the key's index starting at the
-- old head (harvest_key_head); no head when the key has no pending row.
-- The picks that find such a head repair it and compare the keys again
-- (harvest_head_check, for the picks by key heads; harvest_pick_fair_rows,
-- the one-level pick after a refusal). The two-level pick after a refusal
-- reads each key's first row itself and needs no repair.
CREATE OR REPLACE FUNCTION harvest_head_repair(p_queue text, p_head fair_state) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r_head record;
BEGIN
    SELECT * INTO r_head FROM harvest_key_head(p_queue, p_head.key, p_head.head_prio, p_head.head_cont,
                                               p_head.head_due, p_head.head_id);
    UPDATE fair_state SET head_id = r_head.head_id, head_prio = r_head.head_prio,
                          head_cont = r_head.head_cont, head_due = r_head.head_due
    WHERE queue = p_queue AND key = p_head.key;
END
$$;
