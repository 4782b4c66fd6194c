-- Up to p_n claims of p_key, the one key of the queue with work (see
-- harvest_queue_lone), for a batch that holds the queue's fair lock in
-- shared mode. With a single key there is no order between keys to keep,
-- so such batches need not take turns: each locks the next rows of the key
-- that no other claim holds (SKIP LOCKED) beside the others, and only then
-- waits for the key's state row to charge and lease them. The lease comes
-- after that wait (the rows are locked already, so no lock is taken in
-- another order): a lease made before it ran from a moment the worker had
-- not got the row yet, and a long wait on a busy key cut it short. Each charge
-- is the single claim's arithmetic (harvest_charge_terms for the step,
-- harvest_start_tag for each start), row by row, from the state the
-- previous holder of that row committed, so the key pays exactly for every
-- claim whatever the order the batches commit in. A queue charged by
-- runtime never takes this step, so a claim here costs 1.
--
-- The rows come from the head's (priority, band) group first, else from
-- the key's first rows; the caller calls again for the next group. The new
-- head is the first row at or after the old one that is pending in this
-- claim's view: rows another batch holds still count, so the head may be
-- early (the next claim steps over them), never late.
CREATE OR REPLACE FUNCTION harvest_claim_lone(p_queue text, p_key text, p_worker text, p_now timestamptz,
                                              p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_ids     bigint[];
    v_lags    double precision[];
    v_k       integer;
    v_i       integer;
    v_step    double precision;
    v_clock0  double precision;
    v_clock   double precision;
    v_pass    double precision;
    v_start   double precision;
    r_f       fair_state%ROWTYPE;
    r_head    record;
BEGIN
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key;
    -- A prune or repair may have run between the caller's look and its lock.
    IF r_f.head_id IS NULL OR r_f.head_due > v_due_cut THEN
        RETURN;
    END IF;
    SELECT array_agg(id ORDER BY o) INTO v_ids FROM (
        SELECT x.id, row_number() OVER () AS o FROM (
            SELECT y.id FROM tasks y
            WHERE y.queue = p_queue AND y.fairness_key = p_key AND y.state = 'pending'
              AND y.priority = r_f.head_prio AND y.continuation = r_f.head_cont
              AND (y.due_at, y.id) >= (r_f.head_due, r_f.head_id) AND y.due_at <= v_due_cut
            ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
            LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
    IF v_ids IS NULL THEN
        SELECT array_agg(id ORDER BY o) INTO v_ids FROM (
            SELECT x.id, row_number() OVER () AS o FROM (
                SELECT y.id FROM tasks y
                WHERE y.queue = p_queue AND y.fairness_key = p_key AND y.state = 'pending'
                  AND y.due_at <= v_due_cut
                ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id
                LIMIT p_n FOR UPDATE SKIP LOCKED) x) s;
    END IF;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    v_k := cardinality(v_ids);

    -- The charges, under the key's state row: what the batch that held it
    -- before committed is what this one starts from.
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key FOR UPDATE;
    v_clock0 := harvest_clock(p_queue);
    v_clock := v_clock0;
    SELECT t.step INTO v_step FROM harvest_charge_terms(p_queue, p_key, false) t;
    v_pass := r_f.pass;
    v_lags := array_fill(0::double precision, ARRAY[v_k]);
    FOR v_i IN 1..v_k LOOP
        v_start := harvest_start_tag(v_pass, v_clock);
        v_lags[v_i] := v_start - v_clock;
        v_pass := v_start + v_step;
        v_clock := greatest(v_clock, v_start);
    END LOOP;
    -- Lease the rows, now that the wait for the state row is over, and
    -- hand them up. The new head is read after the lease, so that these
    -- rows no longer count as pending.
    RETURN QUERY SELECT * FROM harvest_lease_rows(v_ids, v_lags, p_worker, p_lease);
    SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, r_f.head_prio, r_f.head_cont, r_f.head_due, r_f.head_id);
    UPDATE fair_state SET
        last_start = v_start,
        pass       = v_pass,
        charged_at = v_now,
        in_debt    = true,
        head_id    = r_head.head_id,
        head_prio  = r_head.head_prio,
        head_cont  = r_head.head_cont,
        head_due   = r_head.head_due
    WHERE queue = p_queue AND key = p_key;
    IF v_clock > v_clock0 THEN
        PERFORM harvest_clock_advance(p_queue, v_clock);
    END IF;
END
$$;
