-- One bulk step of a batch: up to p_n rows that as many single claims
-- would take one after the other, or none when this step needs the single
-- claim. The caller holds the queue's fair lock for a fair step and has
-- folded its arrivals; it checked that there is no ageing and no row
-- pinned to the worker.
--   Fair: only when exactly one key of the queue has a head. That key wins
--   every single claim of the step, so its rows are taken in its index
--   order from its head, and then its charges (the same arithmetic as the
--   single charge, in a loop, so pass and last start agree bit for bit)
--   and its new head are written in one update. The lag of each row is the
--   one the single claim reports.
--   Ordinary: the first unlocked rows of the seek index.
-- Both stop before the first row with a quota key: the rechecks are the
-- single claim's business.
CREATE OR REPLACE FUNCTION harvest_claim_bulk(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                              p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_n       integer;
    v_ids     bigint[];
    v_quota   text[];
    v_rows    tasks[];
    v_k       integer;
    v_w       double precision := 1;
    v_clock   double precision;
    v_clock0  double precision;
    v_pass    double precision;
    v_start   double precision;
    v_lags    double precision[] := '{}';
    v_i       integer;
    r_f       fair_state%ROWTYPE;
    r_task    tasks%ROWTYPE;
    r_head    record;
BEGIN
    IF p_fair THEN
        SELECT count(*) INTO v_n FROM (
            SELECT 1 FROM fair_state WHERE queue = p_queue AND head_id IS NOT NULL LIMIT 2) s;
        IF v_n <> 1 THEN
            RETURN;
        END IF;
        SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND head_id IS NOT NULL;
        IF r_f.head_due > v_due_cut THEN
            RETURN;
        END IF;
        -- From the key's head inside its (priority, continuation) group (no
        -- pending row of the key comes before its head); the next step moves
        -- to the next group. Without rows there, the whole key in order.
        SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o) INTO v_ids, v_quota FROM (
            SELECT x.id, x.quota_key, row_number() OVER () AS o FROM (
                SELECT y.id, y.quota_key FROM tasks y
                WHERE y.queue = p_queue AND y.fairness_key = r_f.key AND y.state = 'pending'
                  AND y.priority = r_f.head_prio AND y.continuation = r_f.head_cont
                  AND (y.due_at, y.id) >= (r_f.head_due, r_f.head_id) AND y.due_at <= v_due_cut
                ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                LIMIT p_n FOR UPDATE) x) s;
        IF v_ids IS NULL THEN
            SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o) INTO v_ids, v_quota FROM (
                SELECT x.id, x.quota_key, row_number() OVER () AS o FROM (
                    SELECT y.id, y.quota_key FROM tasks y
                    WHERE y.queue = p_queue AND y.fairness_key = r_f.key AND y.state = 'pending'
                      AND y.due_at <= v_due_cut
                    ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                    LIMIT p_n FOR UPDATE) x) s;
        END IF;
    ELSE
        SELECT array_agg(id ORDER BY o), array_agg(quota_key ORDER BY o) INTO v_ids, v_quota FROM (
            SELECT x.id, x.quota_key, row_number() OVER () AS o FROM (
                SELECT y.id, y.quota_key FROM tasks y
                WHERE y.queue = p_queue AND y.state = 'pending' AND y.due_at <= v_due_cut
                ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
    END IF;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    FOR v_i IN 1..cardinality(v_quota) LOOP
        IF v_quota[v_i] <> '' THEN
            v_ids := v_ids[1:v_i - 1];
            EXIT;
        END IF;
    END LOOP;
    v_k := coalesce(cardinality(v_ids), 0);
    IF v_k = 0 THEN
        RETURN;
    END IF;

    SELECT array_agg(l ORDER BY array_position(v_ids, l.id)) INTO v_rows
    FROM harvest_lease_bulk(v_ids, p_worker, p_lease) AS l;

    IF p_fair THEN
        IF r_f.key <> '' THEN
            SELECT weight INTO v_w FROM weight_overrides WHERE queue = p_queue AND key = r_f.key;
            v_w := coalesce(v_w, 1);
        END IF;
        v_clock0 := harvest_clock(p_queue);
        v_clock := v_clock0;
        v_pass := r_f.pass;
        FOR v_i IN 1..v_k LOOP
            v_lags := v_lags || CASE WHEN v_pass IS NULL THEN 0::double precision
                                     ELSE greatest(v_pass, v_clock) - v_clock END;
            v_start := CASE WHEN v_pass IS NULL THEN v_clock ELSE greatest(v_pass, v_clock) END;
            v_pass := v_start + 1::double precision / v_w;
            v_clock := greatest(v_clock, v_start);
        END LOOP;
        SELECT * INTO r_head FROM harvest_key_head(p_queue, r_f.key, r_f.head_prio, r_f.head_cont,
                                                   r_f.head_due, r_f.head_id);
        UPDATE fair_state SET
            last_start = v_start,
            pass       = v_pass,
            charged_at = v_now,
            in_debt    = true,
            head_id    = r_head.head_id,
            head_prio  = r_head.head_prio,
            head_cont  = r_head.head_cont,
            head_due   = r_head.head_due
        WHERE queue = p_queue AND key = r_f.key;
        -- The keys the new clock caught up with lose their debt mark; marks
        -- are exact, so only passes above the old clock can carry one.
        IF v_start > v_clock0 THEN
            UPDATE fair_state SET in_debt = false
            WHERE queue = p_queue AND in_debt AND pass > v_clock0 AND pass <= v_start;
        END IF;
    END IF;

    FOR v_i IN 1..coalesce(cardinality(v_rows), 0) LOOP
        r_task := v_rows[v_i];
        RETURN NEXT ROW('ok', CASE WHEN p_fair THEN v_lags[array_position(v_ids, r_task.id)] ELSE 0 END,
                        '[]'::jsonb, r_task.id, r_task.run_pk, r_task.queue, r_task.fairness_key,
                        r_task.quota_key, r_task.priority, r_task.continuation, r_task.due_at,
                        r_task.sticky_worker, r_task.sticky_until, r_task.step, r_task.input,
                        r_task.attempt, r_task.lease_token, r_task.lease_expires_at, r_task.trace_context)::harvest_claimed;
    END LOOP;
END
$$;
