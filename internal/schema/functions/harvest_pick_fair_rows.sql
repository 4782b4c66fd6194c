-- The fair pick after a refusal (p_excl: the quota keys refused so far in
-- this claim; p_xkeys: the keys it left out). A refusal leaves out every
-- key whose head it refused, and every key whose head carries a refused
-- quota key (its head would be refused the same way; a fair claim never
-- reads past a key's head into its backlog).
--
-- The keys are walked in the order harvest_pick_fair_heads compares them
-- (the keys without debt from fair_state_free, the keys in debt from
-- fair_state_debt, merged on priority, lag, band, due time and id), the
-- left-out keys skipped. Each key met has its head read by id: a head
-- that carries a refused quota key drops its key and the walk goes on;
-- the first other head is the answer, as cand, which harvest_claim_step
-- locks, waiting for a short holder. So the pick reads the keys in front
-- of its answer, not every key with work: when one refused key stands
-- before thousands, the next key is the answer. When many keys behind a
-- refused quota key stand in front (docs/fairness.md, "Limits"), a walk
-- of key after key costs about twice a single statement that reads every
-- key's head and sorts them; so after c_walk_most (2,000) keys passed
-- over the walk stops and that statement answers (it reads the rows, not the summary,
-- so it needs no repair; the caller computes the lag).
--
-- The walk trusts the summary as harvest_pick_fair_heads does: after the
-- statement's fold no pending row of a key comes before its head. What it
-- cannot serve it hands back as that pick does: redo = 'again' after it
-- cleared debt marks the clock passed, or repaired a head that left the
-- pending state or moved (harvest_head_repair); redo = 'sort' when the
-- chosen head is not due at a caller-given time that went back. Nothing
-- when no key is left.
DROP FUNCTION IF EXISTS harvest_pick_fair_rows(text, timestamptz, text[], double precision);
CREATE OR REPLACE FUNCTION harvest_pick_fair_rows(p_queue text, p_due_cut timestamptz, p_excl text[],
                                                  p_xkeys text[], p_clock double precision,
                                                  OUT took tasks, OUT cand bigint, OUT redo text,
                                                  OUT key_lag double precision)
LANGUAGE plpgsql AS $$
DECLARE
    c_free  refcursor;
    c_debt  refcursor;
    r_a     fair_state%ROWTYPE;
    r_b     fair_state%ROWTYPE;
    r_k     fair_state%ROWTYPE;
    v_use_a boolean;
    v_id    bigint;
    v_quota text;
    v_seen  integer := 0;
    -- Where a walk stops paying: below it, 1,000 keys in front walked
    -- faster than the sort; 20,000 took twice as long (docs/benchmarks.md,
    -- "Behind many refused keys").
    c_walk_most CONSTANT integer := 2000;
BEGIN
    OPEN c_free FOR
        SELECT * FROM fair_state
        WHERE queue = p_queue AND head_id IS NOT NULL AND NOT in_debt AND key <> ALL (p_xkeys)
        ORDER BY head_prio DESC, head_cont DESC, head_due, head_id;
    OPEN c_debt FOR
        SELECT * FROM fair_state
        WHERE queue = p_queue AND head_id IS NOT NULL AND in_debt AND key <> ALL (p_xkeys)
        ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id;
    FETCH c_free INTO r_a;
    FETCH c_debt INTO r_b;
    LOOP
        EXIT WHEN r_a.key IS NULL AND r_b.key IS NULL;
        IF r_b.key IS NOT NULL AND r_b.pass <= p_clock THEN
            PERFORM harvest_debt_clear(p_queue, p_clock);
            redo := 'again';
            EXIT;
        END IF;
        -- The comparison of harvest_pick_fair_heads (written out in both:
        -- a shared SQL function, inlined, made the common pick slower).
        v_use_a := r_b.key IS NULL OR (r_a.key IS NOT NULL AND
            (-r_a.head_prio, 0::double precision, NOT r_a.head_cont, r_a.head_due, r_a.head_id)
            <= (-r_b.head_prio, harvest_lag(r_b.pass, p_clock), NOT r_b.head_cont, r_b.head_due, r_b.head_id));
        IF v_use_a THEN
            r_k := r_a;
        ELSE
            r_k := r_b;
        END IF;
        IF r_k.head_due > p_due_cut THEN
            redo := 'sort';
            EXIT;
        END IF;
        -- The head, by id and without a lock, if it is still where the
        -- summary says (harvest_head_check's test).
        v_id := NULL;
        SELECT x.id, x.quota_key INTO v_id, v_quota FROM tasks x
        WHERE x.id = r_k.head_id AND x.state = 'pending' AND x.queue = p_queue
          AND x.fairness_key = r_k.key AND x.priority = r_k.head_prio
          AND x.continuation = r_k.head_cont AND x.due_at = r_k.head_due;
        IF v_id IS NULL THEN
            PERFORM harvest_head_repair(p_queue, r_k);
            redo := 'again';
            EXIT;
        END IF;
        IF v_quota <> ALL (p_excl) THEN
            cand := v_id;
            key_lag := CASE WHEN v_use_a THEN 0 ELSE harvest_lag(r_k.pass, p_clock) END;
            EXIT;
        END IF;
        v_seen := v_seen + 1;
        IF v_seen >= c_walk_most THEN
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
            EXIT;
        END IF;
        IF v_use_a THEN
            FETCH c_free INTO r_a;
        ELSE
            FETCH c_debt INTO r_b;
        END IF;
    END LOOP;
    -- Closed here rather than at the transaction's end: a batch may pick
    -- after a refusal in many of its steps.
    CLOSE c_free;
    CLOSE c_debt;
END
$$;
