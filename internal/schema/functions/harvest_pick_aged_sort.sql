-- The ordinary pick with ageing by a full sort of the queue's due pending
-- rows, skipping rows other claimers hold: taken when the best rows the
-- loose scan (harvest_pick_aged_levels) found were all held. Dynamic SQL,
-- planned for its actual arguments on every call. The answer is the
-- picks' (harvest_claim_step): took, or nothing.
CREATE OR REPLACE FUNCTION harvest_pick_aged_sort(p_queue text, p_now timestamptz, p_aging integer,
                                                  p_excl text[], p_due_cut timestamptz,
                                                  OUT took tasks, OUT cand bigint, OUT redo text,
                                                  OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE $sql$
        SELECT x.* FROM tasks x
        WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $5
          AND x.quota_key <> ALL ($4)
        ORDER BY x.priority + harvest_us($2, x.due_at) / ($3::bigint * 1000000) DESC,
                 x.continuation DESC, x.due_at, x.id
        LIMIT 1
        FOR UPDATE OF x SKIP LOCKED
        $sql$ INTO took USING p_queue, p_now, p_aging, p_excl, p_due_cut;
END
$$;
