-- The fair pick of a two-level queue after a refusal (p_excl: the quota
-- keys refused so far in this claim; p_xkeys: the keys it left out): each
-- key's head read from its index (one descent per key with work not left
-- out), keys whose head carries a refused quota key dropped as in
-- harvest_pick_fair_rows, the rest compared as in
-- harvest_pick_group_heads. The answer is that head as cand, which
-- harvest_claim_step locks, waiting for a short holder; redo = 'sort' when
-- due work of a key not left out belongs to a key without a head (a lost
-- summary: the full sort serves it); else nothing.
DROP FUNCTION IF EXISTS harvest_pick_group_rows(text, timestamptz, text[], double precision);
CREATE OR REPLACE FUNCTION harvest_pick_group_rows(p_queue text, p_due_cut timestamptz, p_excl text[],
                                                   p_xkeys text[], p_gclock double precision,
                                                   OUT took tasks, OUT cand bigint, OUT redo text,
                                                   OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    cand := (
        SELECT h.id FROM fair_state f
        LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                           WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
        CROSS JOIN LATERAL (
            SELECT y.id, y.priority, y.continuation, y.due_at, y.quota_key FROM tasks y
            WHERE y.queue = f.queue AND y.fairness_key = f.key AND y.state = 'pending'
              AND y.due_at <= p_due_cut
            ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
            LIMIT 1) h
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.key <> ALL (p_xkeys)
          AND h.quota_key <> ALL (p_excl)
        ORDER BY h.priority DESC,
                 harvest_lag(g.pass, p_gclock),
                 harvest_lag(f.pass, coalesce(g.key_clock, 0)),
                 h.continuation DESC, h.due_at, h.id
        LIMIT 1);
    IF cand IS NULL AND EXISTS (SELECT 1 FROM tasks y
            WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= p_due_cut
              AND y.fairness_key <> ALL (p_xkeys)
              AND NOT EXISTS (SELECT 1 FROM fair_state f
                              WHERE f.queue = y.queue AND f.key = y.fairness_key AND f.head_id IS NOT NULL)) THEN
        redo := 'sort';
    END IF;
END
$$;
