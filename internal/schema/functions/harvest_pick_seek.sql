-- The ordinary pick without ageing: the first row of the seek index
-- (queue, priority DESC, continuation DESC, due_at, id) that no other
-- claimer holds and whose quota key was not refused in this claim
-- (p_excl), locked as it is read. It touches nothing of the fair claim.
-- The answer is the picks' (harvest_claim_step): took, or nothing.
CREATE OR REPLACE FUNCTION harvest_pick_seek(p_queue text, p_due_cut timestamptz, p_excl text[],
                                             OUT took tasks, OUT cand bigint, OUT redo text,
                                             OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT * INTO took FROM tasks x
    WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= p_due_cut
      AND x.quota_key <> ALL (p_excl)
    ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
END
$$;
