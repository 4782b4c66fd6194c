-- The fair pick by a full sort of the queue's due pending rows in the
-- claim's order: effective priority (ageing moves rows between priority
-- levels inside every key, so the key heads cannot answer), the group's
-- lag (two-level, p_two, against the groups' clock p_gclock), the key's
-- lag (against its group's key clock, or the queue clock p_clock), band,
-- due time, id. Taken with ageing, and as the fallback of the other fair
-- picks (redo = 'sort'). After a refusal (p_excl: the quota keys refused
-- so far in this claim; p_xkeys: the keys it left out) the sort leaves out
-- those keys, and every key whose head (its first row in the key's own
-- order, effective priority first) carries a refused quota key: a fair
-- claim never reads past a key's head. The sort reads no lock, so the
-- planner keeps only the best row; its answer is that row as cand, which
-- harvest_claim_step locks, waiting for a short holder. Dynamic SQL,
-- planned for its actual arguments on every call (a cached generic plan
-- was several times slower).
DROP FUNCTION IF EXISTS harvest_pick_fair_sort(text, timestamptz, integer, text[], timestamptz, double precision,
                                               boolean, double precision);
CREATE OR REPLACE FUNCTION harvest_pick_fair_sort(p_queue text, p_now timestamptz, p_aging integer,
                                                  p_excl text[], p_xkeys text[], p_due_cut timestamptz,
                                                  p_clock double precision, p_two boolean,
                                                  p_gclock double precision,
                                                  OUT took tasks, OUT cand bigint, OUT redo text,
                                                  OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_excl) = 0 AND cardinality(p_xkeys) = 0 THEN
        EXECUTE $sql$
            SELECT x.id FROM tasks x
            LEFT JOIN fair_state f ON f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
            LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                           WHERE $7 AND g0.queue = x.queue AND g0.grp = split_part(x.fairness_key, '/', 1) LIMIT 1) g ON true
            WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $5
              AND x.quota_key <> ALL ($4)
            ORDER BY x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END DESC,
                     harvest_lag(g.pass, $8),
                     harvest_lag(f.pass, CASE WHEN $7 THEN coalesce(g.key_clock, 0) ELSE $6 END),
                     x.continuation DESC, x.due_at, x.id
            LIMIT 1
            $sql$ INTO cand USING p_queue, p_now, p_aging, p_excl, p_due_cut, p_clock, p_two, p_gclock;
        RETURN;
    END IF;
    EXECUTE $sql$
        WITH r AS (
            SELECT x.id, x.fairness_key, x.quota_key, x.continuation, x.due_at,
                   x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END AS ep,
                   row_number() OVER (PARTITION BY x.fairness_key
                                      ORDER BY x.priority + CASE WHEN $3 > 0 THEN harvest_us($2, x.due_at) / ($3::bigint * 1000000) ELSE 0 END DESC,
                                               x.continuation DESC, x.due_at, x.id) AS o
            FROM tasks x
            WHERE x.queue = $1 AND x.state = 'pending' AND x.due_at <= $5 AND x.fairness_key <> ALL ($9)
        )
        SELECT r.id FROM r
        LEFT JOIN fair_state f ON f.queue = $1 AND f.key = r.fairness_key AND f.charged_at IS NOT NULL
        LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                       WHERE $7 AND g0.queue = $1 AND g0.grp = split_part(r.fairness_key, '/', 1) LIMIT 1) g ON true
        WHERE r.o = 1 AND r.quota_key <> ALL ($4)
        ORDER BY r.ep DESC,
                 harvest_lag(g.pass, $8),
                 harvest_lag(f.pass, CASE WHEN $7 THEN coalesce(g.key_clock, 0) ELSE $6 END),
                 r.continuation DESC, r.due_at, r.id
        LIMIT 1
        $sql$ INTO cand USING p_queue, p_now, p_aging, p_excl, p_due_cut, p_clock, p_two, p_gclock, p_xkeys;
END
$$;
