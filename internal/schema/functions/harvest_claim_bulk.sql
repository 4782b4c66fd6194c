-- One ordinary bulk step of a batch: up to p_n rows of the seek index, in
-- its order, as that many single ordinary claims would take them, quota
-- rechecks and refusals included. The caller checked that there is no
-- ageing and no row pinned to the worker. Fair steps are
-- harvest_claim_bulk_fair's.
--
-- A single ordinary claim reads the seek index from the top, skipping rows
-- other claimers hold and rows of the quota keys it refused already; a row
-- with a quota key goes through harvest_quota_recheck, and a refused row
-- stays pending (and locked) while its quota key is left out of the rest
-- of that claim. A quota only gets stricter within the statement (no time
-- passes, no row of its key ends, and no row of a refused key is taken
-- after the refusal), so every later claim of the batch that reaches a
-- refused row refuses it again, and it is the first row of its quota key
-- each of them reaches. So the claims follow one walk of the seek order:
--   1. lock the quota rows of the quota keys of the next rows (read
--      without locks, as many as are still wanted), in key order, count
--      their running rows and refill their buckets to now, once per step
--      (harvest_bulk_quotas);
--   2. read those rows again, locking them (SKIP LOCKED, as the single
--      pick) and leaving out the rows taken already and the refused quota
--      keys; a quota key 1 did not see (rows another claimer held or
--      committed meanwhile) has its quota row locked now;
--   3. walk the rows: a row of a refused quota key is skipped; a row of a
--      quota key with a quota row is accepted while its cap (running rows
--      plus rows accepted so far) and its bucket (less one token per row
--      accepted so far) allow it, else refused: its quota key is left out
--      from there on, and every row accepted after it reports it, as the
--      refusals of its single claim (all the refused rows come before it,
--      one per quota key, in the order they were met);
--   4. again from 1 while rows are wanted and the last read was full (the
--      rows of a quota key refused in it were not taken);
--   5. write each bucket once (the tokens the single claims would have
--      left, subtracted one at a time) and lease the rows in one update.
-- Quota rows before rows (1, 2): a fair claim that holds a quota row may
-- wait for a pending row (the fair picks lock a key's head waiting), so a
-- step that waited for that quota row while holding the rows it read could
-- deadlock with it (TestConcurrencyCapHoldsUnderConcurrentClaims did). The
-- step waits for quota rows before it locks its rows; only a quota key
-- first met in 2, or in a later read of the step, is waited for while rows
-- are held, as a batch of single claims holds the rows of its earlier
-- claims. In a queue without quotas every row is taken and 1 is skipped.
-- A claim that would reach 8 refusals ends the batch with them: the step
-- returns the rows before it and stops, and the batch's next step, which
-- takes no row before those 8 refusals, leaves that claim to the single
-- claim, which ends the batch. So the step never returns a 'refused' row.
-- The quota rows of 1 and 2 are waited for only in their lock order
-- (harvest_bulk_quotas): a key met after a later key's row was locked
-- (in 2, in a later read, or in an earlier step of the batch) is taken
-- only when no other claimer holds it. When one does, the walk ends
-- before that key's first row: the rows before it are taken with exact
-- caps and buckets (their quota rows are held), the rest stay pending,
-- and a last row with outcome 'busy' tells the batch to end there; the
-- next batch takes them.
CREATE OR REPLACE FUNCTION harvest_claim_bulk(p_queue text, p_worker text, p_now timestamptz,
                                              p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    -- The rows read last (2), and the rows accepted so far with the
    -- refusals of each one's claim.
    v_ids     bigint[];
    v_qks     text[];
    v_want    integer;
    v_take    bigint[] := '{}';
    v_refs    jsonb[] := '{}';
    -- The refusals so far: the refused rows and their quota keys.
    v_ref     jsonb := '[]';
    v_nref    integer := 0;
    v_excl    text[] := '{}';
    -- The quota keys met (1, 2), and of those with a quota row: the cap,
    -- running rows, rate, tokens left and rows accepted.
    v_seen    text[] := '{}';
    v_new     text[];
    v_qk      text[] := '{}';
    v_qcap    integer[] := '{}';
    v_qrun    integer[] := '{}';
    v_qrate   double precision[] := '{}';
    v_qtok    double precision[] := '{}';
    v_qacc    integer[] := '{}';
    v_qi      integer;
    v_i       integer;
    v_why     text;
    -- The quota keys whose quota rows another claimer holds and this step
    -- may not wait for (harvest_bulk_quotas): the walk ends at the first
    -- row of one, and so does the batch.
    v_busy    text[] := '{}';
    v_stop    boolean := false;
    v_ended   boolean := false;
    v_quotas  boolean := EXISTS (SELECT 1 FROM quotas q WHERE q.queue = p_queue);
    r_out     harvest_claimed;
BEGIN
    LOOP
        v_want := p_n - cardinality(v_take);
        -- 1. The quota rows of the next rows.
        IF v_quotas THEN
            v_new := ARRAY(SELECT DISTINCT y.quota_key FROM (
                SELECT x.quota_key FROM tasks x
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
                  AND x.quota_key <> ALL (v_excl) AND x.id <> ALL (v_take)
                ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
                LIMIT v_want) y
                WHERE y.quota_key <> '' AND y.quota_key <> ALL (v_seen));
            IF cardinality(v_new) > 0 THEN
                v_seen := v_seen || v_new;
                SELECT v_qk || array_agg(h.quota_key ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qcap || array_agg(h.max_concurrent ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qrun || array_agg(h.running ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qrate || array_agg(h.rate ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qtok || array_agg(h.tokens ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qacc || array_agg(0 ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_busy || array_agg(h.quota_key) FILTER (WHERE h.busy)
                INTO v_qk, v_qcap, v_qrun, v_qrate, v_qtok, v_qacc, v_busy
                FROM harvest_bulk_quotas(p_queue, v_new, v_now, true) h;
            END IF;
        END IF;

        -- 2. The rows, locked.
        SELECT array_agg(y.id ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id),
               array_agg(y.quota_key ORDER BY y.priority DESC, y.continuation DESC, y.due_at, y.id)
        INTO v_ids, v_qks
        FROM (SELECT x.id, x.quota_key, x.priority, x.continuation, x.due_at FROM tasks x
              WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
                AND x.quota_key <> ALL (v_excl) AND x.id <> ALL (v_take)
              ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
              LIMIT v_want FOR UPDATE SKIP LOCKED) y;
        EXIT WHEN v_ids IS NULL;
        IF v_quotas THEN
            v_new := ARRAY(SELECT DISTINCT q FROM unnest(v_qks) q WHERE q <> '' AND q <> ALL (v_seen));
            IF cardinality(v_new) > 0 THEN
                v_seen := v_seen || v_new;
                SELECT v_qk || array_agg(h.quota_key ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qcap || array_agg(h.max_concurrent ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qrun || array_agg(h.running ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qrate || array_agg(h.rate ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qtok || array_agg(h.tokens ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_qacc || array_agg(0 ORDER BY h.quota_key) FILTER (WHERE NOT h.busy),
                       v_busy || array_agg(h.quota_key) FILTER (WHERE h.busy)
                INTO v_qk, v_qcap, v_qrun, v_qrate, v_qtok, v_qacc, v_busy
                FROM harvest_bulk_quotas(p_queue, v_new, v_now, true) h;
            END IF;
        END IF;

        -- The common shape: nothing to recheck, all of them taken.
        IF cardinality(v_take) = 0 AND v_nref = 0
           AND (NOT v_quotas OR NOT EXISTS (SELECT 1 FROM unnest(v_qks) q WHERE q = ANY (v_qk) OR q = ANY (v_busy))) THEN
            RETURN QUERY SELECT * FROM harvest_lease_rows(v_ids, NULL, p_worker, p_lease);
            RETURN;
        END IF;

        -- 3. The walk.
        FOR v_i IN 1..cardinality(v_ids) LOOP
            CONTINUE WHEN v_qks[v_i] = ANY (v_excl);
            IF v_qks[v_i] = ANY (v_busy) THEN
                v_stop := true;
                v_ended := true;
                EXIT;
            END IF;
            v_qi := array_position(v_qk, v_qks[v_i]);
            IF v_qi IS NOT NULL THEN
                v_why := NULL;
                IF v_qcap[v_qi] IS NOT NULL AND v_qrun[v_qi] + v_qacc[v_qi] >= v_qcap[v_qi] THEN
                    v_why := 'concurrency_cap';
                ELSIF v_qrate[v_qi] IS NOT NULL AND v_qtok[v_qi] < 1 THEN
                    v_why := 'rate_limit';
                END IF;
                IF v_why IS NOT NULL THEN
                    v_nref := v_nref + 1;
                    IF v_nref >= 8 THEN
                        v_stop := true;
                        EXIT;
                    END IF;
                    v_ref := v_ref || jsonb_build_array(jsonb_build_object(
                        'task_id', v_ids[v_i], 'quota_key', v_qks[v_i], 'reason', v_why));
                    v_excl := array_append(v_excl, v_qks[v_i]);
                    CONTINUE;
                END IF;
                v_qacc[v_qi] := v_qacc[v_qi] + 1;
                IF v_qrate[v_qi] IS NOT NULL THEN
                    v_qtok[v_qi] := v_qtok[v_qi] - 1;
                END IF;
            END IF;
            v_take := array_append(v_take, v_ids[v_i]);
            v_refs := array_append(v_refs, v_ref);
        END LOOP;
        -- 4. A short read: no other row is there to take.
        EXIT WHEN v_stop OR cardinality(v_ids) < v_want OR cardinality(v_take) >= p_n;
    END LOOP;
    IF cardinality(v_take) = 0 THEN
        IF v_ended THEN
            r_out.outcome := 'busy';
            RETURN NEXT r_out;
        END IF;
        RETURN;
    END IF;

    -- 5. The buckets of the rows taken, then the lease.
    FOR v_qi IN 1..coalesce(cardinality(v_qk), 0) LOOP
        CONTINUE WHEN v_qrate[v_qi] IS NULL OR v_qacc[v_qi] = 0;
        INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at)
        VALUES (p_queue, v_qk[v_qi], v_qtok[v_qi], v_now)
        ON CONFLICT (queue, quota_key) DO UPDATE
        SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at;
    END LOOP;
    v_i := 0;
    FOR r_out IN SELECT * FROM harvest_lease_rows(v_take, NULL, p_worker, p_lease) LOOP
        v_i := v_i + 1;
        r_out.refusals := v_refs[v_i];
        RETURN NEXT r_out;
    END LOOP;
    IF v_ended THEN
        r_out := NULL;
        r_out.outcome := 'busy';
        RETURN NEXT r_out;
    END IF;
END
$$;
