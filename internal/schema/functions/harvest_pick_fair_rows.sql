-- The fair pick after a refusal (p_excl: the quota keys refused so far in
-- this claim; p_xkeys: the keys it left out). A refusal leaves out every
-- key whose head it refused, and every key whose head carries a refused
-- quota key (its head would be refused the same way; a fair claim never
-- reads past a key's head into its backlog). So each key with work not
-- left out gets one descent of its index for its head (the fair_state
-- summary may be stale, the rows are not), the keys whose head carries a
-- refused quota key drop out, and the rest are compared on their heads by
-- (priority, lag, band, due time, id). The answer is that head as cand,
-- which harvest_claim_step locks, waiting for a short holder; nothing when
-- no key is left.
DROP FUNCTION IF EXISTS harvest_pick_fair_rows(text, timestamptz, text[], double precision);
CREATE OR REPLACE FUNCTION harvest_pick_fair_rows(p_queue text, p_due_cut timestamptz, p_excl text[],
                                                  p_xkeys text[], p_clock double precision,
                                                  OUT took tasks, OUT cand bigint, OUT redo text,
                                                  OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    cand := (
        SELECT h.id FROM fair_state f
        CROSS JOIN LATERAL (
            SELECT y.id, y.priority, y.continuation, y.due_at, y.quota_key FROM tasks y
            WHERE y.queue = f.queue AND y.fairness_key = f.key AND y.state = 'pending'
              AND y.due_at <= p_due_cut
            ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
            LIMIT 1) h
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL AND f.key <> ALL (p_xkeys)
          AND h.quota_key <> ALL (p_excl)
        ORDER BY h.priority DESC, harvest_lag(f.pass, p_clock), h.continuation DESC, h.due_at, h.id
        LIMIT 1);
END
$$;
