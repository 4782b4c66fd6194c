-- The ordinary pick with ageing (p_aging seconds a level), without a sort
-- of the backlog. Inside one priority level the oldest row has the
-- largest boost, so the level's best effective priority comes from its
-- oldest due row; the rows that reach the overall best E in level p are
-- those due at or before now - (E - p) * ageing. Levels are found by a
-- loose scan of the seek index; each level costs a few descents. The first
-- rows of each best level are read without locks and only the first one no
-- other claimer holds is locked, so the claim holds no row it does not
-- take. When every best row is held by another claimer, the answer is
-- redo = 'sort': the full sort (harvest_pick_aged_sort) skips held rows
-- properly. The answer is the picks' (harvest_claim_step).
CREATE OR REPLACE FUNCTION harvest_pick_aged_levels(p_queue text, p_now timestamptz, p_aging integer,
                                                    p_excl text[], p_due_cut timestamptz,
                                                    OUT took tasks, OUT cand bigint, OUT redo text,
                                                    OUT key_lag double precision)
LANGUAGE plpgsql AS $$
DECLARE
    v_cands bigint[];
BEGIN
    -- Dynamic SQL: planned for its actual arguments on every call.
    EXECUTE $sql$
    SELECT array_agg(c.id ORDER BY c.continuation DESC, c.due_at, c.id)
    FROM (
        WITH RECURSIVE lv(p) AS (
            (SELECT y.priority FROM tasks y
             WHERE y.queue = $1 AND y.state = 'pending'
             ORDER BY y.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT y.priority FROM tasks y
                    WHERE y.queue = $1 AND y.state = 'pending' AND y.priority < lv.p
                    ORDER BY y.priority DESC LIMIT 1)
            FROM lv WHERE lv.p IS NOT NULL
        ), m AS (
            SELECT lv.p, lv.p + harvest_us($2, d.due) / ($3::bigint * 1000000) AS eff
            FROM lv CROSS JOIN LATERAL (SELECT least(
                (SELECT y.due_at FROM tasks y
                 WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = lv.p AND y.continuation
                   AND y.due_at <= $5 AND y.quota_key <> ALL ($4)
                 ORDER BY y.due_at, y.id LIMIT 1),
                (SELECT y.due_at FROM tasks y
                 WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = lv.p AND NOT y.continuation
                   AND y.due_at <= $5 AND y.quota_key <> ALL ($4)
                 ORDER BY y.due_at, y.id LIMIT 1)) AS due) d
            WHERE lv.p IS NOT NULL AND d.due IS NOT NULL
        ), top AS (
            SELECT m.p, $2 - ((max(m.eff) OVER () - m.p) * $3::bigint * 1000000) * interval '1 microsecond' AS hi,
                   m.eff = max(m.eff) OVER () AS best
            FROM m
        )
        SELECT z.id, z.continuation, z.due_at
        FROM top
        CROSS JOIN LATERAL (
            (SELECT y.id, y.continuation, y.due_at FROM tasks y
             WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND y.continuation
               AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
             ORDER BY y.due_at, y.id LIMIT 4)
            UNION ALL
            (SELECT y.id, y.continuation, y.due_at FROM tasks y
             WHERE y.queue = $1 AND y.state = 'pending' AND y.priority = top.p AND NOT y.continuation
               AND y.due_at <= top.hi AND y.quota_key <> ALL ($4)
             ORDER BY y.due_at, y.id LIMIT 4)) z
        WHERE top.best
    ) c
    $sql$ INTO v_cands USING p_queue, p_now, p_aging, p_excl, p_due_cut;
    IF v_cands IS NOT NULL THEN
        SELECT * INTO took FROM tasks x
        WHERE x.id = ANY (v_cands) AND x.state = 'pending'
        ORDER BY array_position(v_cands, x.id)
        LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF took.id IS NULL AND EXISTS (SELECT 1 FROM tasks y
                                   WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= p_due_cut
                                     AND y.quota_key <> ALL (p_excl)) THEN
        redo := 'sort';
    END IF;
END
$$;
