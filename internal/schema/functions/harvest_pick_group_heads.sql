-- The fair pick of a two-level queue without ageing and without refusals,
-- by the key heads: compared by head priority, then the group's lag among
-- the groups (against the groups' clock p_gclock), then the key's lag
-- against its group's key clock, then the head's band, due time and id.
-- Every key with work is read (no index orders keys by their group's
-- lag), so a claim costs in proportion to the queue's keys. The chosen
-- key's head is taken or repaired as in the one-level pick
-- (harvest_head_check). The answer is the picks' (harvest_claim_step):
-- took (the lag is the caller's to read), redo = 'again' after a repair,
-- redo = 'sort' as in harvest_pick_fair_heads, or nothing.
CREATE OR REPLACE FUNCTION harvest_pick_group_heads(p_queue text, p_due_cut timestamptz, p_gclock double precision,
                                                    OUT took tasks, OUT cand bigint, OUT redo text,
                                                    OUT key_lag double precision)
LANGUAGE plpgsql AS $$
DECLARE
    r_k fair_state%ROWTYPE;
BEGIN
    SELECT f.* INTO r_k FROM fair_state f
    LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                       WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
    WHERE f.queue = p_queue AND f.head_id IS NOT NULL
    ORDER BY f.head_prio DESC,
             harvest_lag(g.pass, p_gclock),
             harvest_lag(f.pass, coalesce(g.key_clock, 0)),
             f.head_cont DESC, f.head_due, f.head_id
    LIMIT 1;
    IF r_k.key IS NULL THEN
        IF harvest_queue_pending(p_queue) THEN
            redo := 'sort';
        END IF;
        RETURN;
    END IF;
    IF r_k.head_due > p_due_cut THEN
        redo := 'sort';
        RETURN;
    END IF;
    took := harvest_head_check(p_queue, r_k);
    IF took.id IS NULL THEN
        redo := 'again';
    END IF;
END
$$;
