-- Rows pinned to the claiming worker (sticky_worker, until sticky_until)
-- come before every other pick of a claim (harvest_claim_step tries this
-- one first when the worker has a name). They are rare and have their own
-- partial index, so they are sorted in full, in the claim's order:
-- effective priority (with ageing, p_aging > 0), then for a fair claim the
-- group's lag (two-level, p_two) and the key's lag, then band, due time
-- and id. The first row no other claimer holds is locked and returned.
-- p_excl: quota keys refused earlier in this claim; p_xkeys: for a fair
-- claim, the fairness keys it left out after a refusal (harvest_claim_step
-- puts there every key whose pinned head carries a refused quota key, so a
-- row of a key not left out is never behind a refused one of its key).
DROP FUNCTION IF EXISTS harvest_pick_sticky(text, text, boolean, integer, timestamptz, timestamptz, text[], boolean,
                                            double precision, double precision);
CREATE OR REPLACE FUNCTION harvest_pick_sticky(p_queue text, p_worker text, p_fair boolean, p_aging integer,
                                               p_now timestamptz, p_due_cut timestamptz, p_excl text[],
                                               p_xkeys text[], p_two boolean, p_clock double precision,
                                               p_gclock double precision)
RETURNS tasks
LANGUAGE plpgsql AS $$
DECLARE
    r_task tasks%ROWTYPE;
BEGIN
    SELECT x.* INTO r_task FROM tasks x
    LEFT JOIN fair_state f ON p_fair AND f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
    LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                       WHERE p_two AND g0.queue = x.queue AND g0.grp = split_part(x.fairness_key, '/', 1) LIMIT 1) g ON true
    WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
      AND x.sticky_until > p_now AND x.due_at <= p_due_cut
      AND x.quota_key <> ALL (p_excl) AND x.fairness_key <> ALL (p_xkeys)
    ORDER BY x.priority + CASE WHEN p_aging > 0 THEN harvest_us(p_now, x.due_at) / (p_aging::bigint * 1000000) ELSE 0 END DESC,
             harvest_lag(g.pass, p_gclock),
             harvest_lag(f.pass, CASE WHEN p_two THEN coalesce(g.key_clock, 0) ELSE p_clock END),
             x.continuation DESC, x.due_at, x.id
    LIMIT 1
    FOR UPDATE OF x SKIP LOCKED;
    RETURN r_task;
END
$$;
