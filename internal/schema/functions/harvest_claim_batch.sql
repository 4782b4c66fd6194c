-- Up to p_n claims in one statement, each in the order the single claim
-- would take it; a fair batch charges the key of every row taken. A fair
-- batch takes the queue's fair lock once, so the whole batch is one turn
-- of the queue's claims. Bulk steps (harvest_claim_bulk_fair,
-- harvest_claim_bulk) take runs of rows at once where that gives the same
-- result; every other step is the single claim. When the batch stops early with refusals, a last row with
-- outcome 'refused' carries them. p_release_early: see harvest_claim.
CREATE OR REPLACE FUNCTION harvest_claim_batch(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                               p_aging integer, p_lease interval, p_n integer,
                                               p_release_early boolean)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    r_out  harvest_claimed;
    v_left integer := p_n;
    v_got  integer;
    v_bulk boolean;
    v_took boolean := false;
BEGIN
    IF p_fair THEN
        PERFORM harvest_queue_lock(p_queue);
        IF p_release_early THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
    END IF;
    PERFORM harvest_promote_due(p_queue, coalesce(p_now, now()), 1000);
    IF p_fair THEN
        PERFORM harvest_fair_fold(p_queue);
    END IF;
    v_bulk := p_aging = 0
        AND NOT (p_worker <> '' AND EXISTS (
            SELECT 1 FROM tasks x
            WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
              AND x.sticky_until > coalesce(p_now, now())));
    WHILE v_left > 0 LOOP
        -- One row is cheaper by the single claim than by a bulk plan.
        IF v_bulk AND v_left > 1 THEN
            v_got := 0;
            IF p_fair THEN
                FOR r_out IN SELECT * FROM harvest_claim_bulk_fair(p_queue, p_worker, p_now, p_lease, v_left) LOOP
                    v_got := v_got + 1;
                    RETURN NEXT r_out;
                END LOOP;
            ELSE
                FOR r_out IN SELECT * FROM harvest_claim_bulk(p_queue, p_worker, p_now, p_lease, v_left) LOOP
                    v_got := v_got + 1;
                    RETURN NEXT r_out;
                END LOOP;
            END IF;
            v_took := v_took OR v_got > 0;
            v_left := v_left - v_got;
            CONTINUE WHEN v_got > 0;
        END IF;
        r_out := harvest_claim_step(p_queue, p_worker, p_now, p_fair, p_aging, p_lease, NULL);
        EXIT WHEN r_out.outcome <> 'ok';
        v_took := true;
        RETURN NEXT r_out;
        v_left := v_left - 1;
    END LOOP;
    IF r_out.outcome = 'refused' THEN
        RETURN NEXT r_out;
    END IF;
    IF p_fair AND p_release_early AND v_took THEN
        PERFORM set_config('harvest.flush', 'on', false);
    END IF;
END
$$;
