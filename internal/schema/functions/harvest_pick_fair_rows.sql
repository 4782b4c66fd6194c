-- The fair pick after a refusal (p_excl: the quota keys refused so far in
-- this claim). A refused quota key can hide rows inside a key, so the key
-- heads cannot answer: each key with work gets one descent of its index
-- for its first row that no refusal excluded (plus the excluded rows it
-- steps over), and the keys are compared on those rows by (priority, lag,
-- band, due time, id). The answer is that row as cand, which
-- harvest_claim_step locks, waiting for a short holder; nothing when no
-- key has such a row.
CREATE OR REPLACE FUNCTION harvest_pick_fair_rows(p_queue text, p_due_cut timestamptz, p_excl text[],
                                                  p_clock double precision,
                                                  OUT took tasks, OUT cand bigint, OUT redo text,
                                                  OUT key_lag double precision)
LANGUAGE plpgsql AS $$
BEGIN
    cand := (
        SELECT h.id FROM fair_state f
        CROSS JOIN LATERAL (
            SELECT y.id, y.priority, y.continuation, y.due_at FROM tasks y
            WHERE y.queue = f.queue AND y.fairness_key = f.key AND y.state = 'pending'
              AND y.due_at <= p_due_cut AND y.quota_key <> ALL (p_excl)
            ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
            LIMIT 1) h
        WHERE f.queue = p_queue AND f.head_id IS NOT NULL
        ORDER BY h.priority DESC, harvest_lag(f.pass, p_clock), h.continuation DESC, h.due_at, h.id
        LIMIT 1);
END
$$;
