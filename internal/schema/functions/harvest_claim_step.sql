-- One claim from one queue, for a caller that has done what a claim does
-- once per statement (harvest_claim_prepare: for a fair claim, taken the
-- queue's fair lock and folded its arrivals). Callers: harvest_claim, and
-- harvest_claim_batch for every row its bulk steps do not take.
--   p_now NULL: the database clock (transaction start). Leases always use
--   the database clock.
--   p_task_id: claim that row only (dispatch channel).
--   p_two_level, p_runtime: the queue's fairness modes as
--   harvest_claim_prepare read them under the fair lock (they cannot
--   change while it is held); ignored for an ordinary claim.
--
-- The step, in order (docs/claim.md, "How a claim runs", maps each part):
--   1. pick a row: the named row (harvest_pick_named) for a dispatch
--      claim; else rows pinned to this worker first (harvest_pick_sticky),
--      then the queue's pick for the claim's kind (below);
--   2. the lag of the row's key (harvest_lag), when the pick did not say;
--   3. the rechecks of the row's quota key (harvest_quota_recheck): a
--      refused row is left pending and charges nothing, and the claim
--      picks again (at most 8 refusals; a dispatch claim stops at the
--      first); an ordinary claim that would wait for a quota row out of
--      the lock order ends there, as if no row were left. What the rest of the claim leaves out (the model's rule,
--      pkg/fairkeys Model.Claim): an ordinary claim, the rows of the
--      refused quota key (v_excl); a fair claim, the refused row's whole
--      fairness key (v_xkeys; the row was its key's head, and the key's
--      later rows wait behind it), and every key whose head carries a
--      refused quota key (the picks drop those on reading the heads, and
--      for rows pinned to the worker this step adds them to v_xkeys);
--   4. the lease, and the run marked running (its fields the worker needs
--      come back with the claim);
--   5. for a fair claim, the charge (harvest_charge_terms, harvest_charge).
--
-- The queue's pick, by the claim's kind:
--   harvest_pick_seek          ordinary, no ageing
--   harvest_pick_aged_levels   ordinary with ageing, by a loose scan of levels
--   harvest_pick_aged_sort     ordinary with ageing whose best rows are held
--   harvest_pick_fair_sort     fair with ageing, or the fallback of a fair pick
--   harvest_pick_group_rows    fair, two-level, after a refusal
--   harvest_pick_group_heads   fair, two-level
--   harvest_pick_fair_rows     fair, after a refusal
--   harvest_pick_fair_heads    fair (the common case)
-- Until issue 38 these were the labelled sections of this one function;
-- for readers of its history: 1 = harvest_pick_sticky, 2a = seek,
-- 2b = aged_levels, 2c = aged_sort, 2d = fair_sort, 2e = fair_rows,
-- 2f = fair_heads, 2g = group_heads, 2h = group_rows; the head check
-- written out in 2f and 2g is harvest_head_check, section 3
-- harvest_quota_recheck.
--
-- Every queue pick answers with the same four fields:
--   took     the row, locked: the pick took it;
--   cand     a row chosen without a lock: this step locks it waiting (the
--            only other holders of a pending row are ordinary claims and
--            cancels, both short; skipping it would let the claim take a
--            row the fair order puts later) and picks again if it left the
--            pending state meanwhile;
--   redo     'sort': the summary cannot serve the pick; a fair step
--            folds the arrivals once more and picks again, and if the
--            fold changed nothing, this claim falls back to the full sort
--            for the rest of its picks; 'again': the pick changed the fairness summary
--            (a repaired head, a cleared debt mark), pick again;
--   key_lag  the lag of the row's key, when the pick knows it.
-- All NULL: nothing to claim.
--
-- A queue's fairness modes (queue_fairness) change the fair claim: in a
-- two-level queue the keys are compared by their group's lag among the
-- groups first (fair_groups, clock fair_queues.group_clock), then by their
-- own lag against the group's key clock; in a queue charged by runtime a
-- claim costs the key's runtime estimate instead of 1, and the row records
-- it (charged_secs) for the settlement when the attempt ends
-- (harvest_task_held).
DROP FUNCTION IF EXISTS harvest_claim_step(text, text, timestamptz, boolean, integer, interval, bigint);
CREATE OR REPLACE FUNCTION harvest_claim_step(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                              p_aging integer, p_lease interval, p_task_id bigint,
                                              p_two_level boolean, p_runtime boolean)
RETURNS harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_at      timestamptz;  -- when the row is leased (database clock)
    -- Rows in the pending state are due: they became pending at or after
    -- their due time. With the database clock a claim may see a row that
    -- committed after its own start (now() is the transaction's start), so
    -- only a caller-given time filters on due_at.
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_excl    text[] := '{}';
    v_xkeys   text[] := '{}';
    v_ref     jsonb := '[]';
    v_nref    integer := 0;
    v_clock   double precision;
    v_gclock  double precision := 0;
    v_two     boolean := p_fair AND p_two_level;
    v_runtime boolean := p_fair AND p_runtime;
    v_cost    double precision := 1;
    v_step    double precision;
    v_lag     double precision;
    v_sort    boolean := false;
    v_refolded boolean := false;
    v_reason  text;
    v_pick    record;
    r_task    tasks%ROWTYPE;
    r_run     runs;
    r_out     harvest_claimed;
BEGIN
    IF p_fair THEN
        v_clock := harvest_clock(p_queue);
        IF v_two THEN
            SELECT coalesce(max(q.group_clock), 0) INTO v_gclock FROM fair_queues q WHERE q.queue = p_queue;
        END IF;
    END IF;
    LOOP
        -- 1. Pick.
        r_task := NULL;
        v_lag := NULL;
        IF p_task_id IS NOT NULL THEN
            r_task := harvest_pick_named(p_queue, p_task_id, v_due_cut);
        ELSE
            -- The probe is cheaper than the call, and a worker almost
            -- never has a pinned row waiting.
            IF harvest_pinned_waiting(p_queue, p_worker, v_now, v_due_cut) THEN
                r_task := harvest_pick_sticky(p_queue, p_worker, p_fair, p_aging, v_now, v_due_cut, v_excl,
                                              v_xkeys, v_two, v_clock, v_gclock);
            END IF;
            IF r_task.id IS NULL THEN
                IF NOT p_fair AND p_aging = 0 THEN
                    v_pick := harvest_pick_seek(p_queue, v_due_cut, v_excl);
                ELSIF NOT p_fair AND NOT v_sort THEN
                    v_pick := harvest_pick_aged_levels(p_queue, v_now, p_aging, v_excl, v_due_cut);
                ELSIF NOT p_fair THEN
                    v_pick := harvest_pick_aged_sort(p_queue, v_now, p_aging, v_excl, v_due_cut);
                ELSIF p_aging > 0 OR v_sort THEN
                    v_pick := harvest_pick_fair_sort(p_queue, v_now, p_aging, v_excl, v_xkeys, v_due_cut,
                                                     v_clock, v_two, v_gclock);
                ELSIF v_two AND cardinality(v_excl) > 0 THEN
                    v_pick := harvest_pick_group_rows(p_queue, v_due_cut, v_excl, v_xkeys, v_gclock);
                ELSIF v_two THEN
                    v_pick := harvest_pick_group_heads(p_queue, v_due_cut, v_gclock);
                ELSIF cardinality(v_excl) > 0 THEN
                    v_pick := harvest_pick_fair_rows(p_queue, v_due_cut, v_excl, v_xkeys, v_clock);
                ELSE
                    v_pick := harvest_pick_fair_heads(p_queue, v_due_cut, v_clock);
                END IF;
                IF v_pick.redo = 'sort' THEN
                    -- The summary cannot serve the pick. Most often it is
                    -- only behind: rows whose starts committed after this
                    -- claim statement folded its arrivals are pending
                    -- (each statement of the claim sees what has committed
                    -- before it) and have no head yet. Fold once more (a
                    -- fair claim holds the queue's fair lock) and pick
                    -- again; only what a fold does not mend (a lost
                    -- summary, a due time that went back) gets the sort.
                    IF p_fair AND NOT v_refolded THEN
                        v_refolded := true;
                        CONTINUE WHEN harvest_fair_fold(p_queue) > 0;
                    END IF;
                    v_sort := true;
                    CONTINUE;
                END IF;
                CONTINUE WHEN v_pick.redo = 'again';
                r_task := v_pick.took;
                v_lag := v_pick.key_lag;
                IF r_task.id IS NULL AND v_pick.cand IS NOT NULL THEN
                    SELECT * INTO r_task FROM tasks x
                    WHERE x.id = v_pick.cand AND x.state = 'pending'
                    FOR UPDATE;
                    CONTINUE WHEN r_task.id IS NULL;
                END IF;
            END IF;
        END IF;

        IF r_task.id IS NULL THEN
            r_out.outcome := CASE WHEN v_nref > 0 THEN 'refused' ELSE 'no_task' END;
            r_out.refusals := v_ref;
            RETURN r_out;
        END IF;

        -- 2. The lag of the row's key, when the pick did not say: against
        -- its group's key clock in a two-level queue, else the queue clock.
        IF p_fair AND v_lag IS NULL THEN
            IF v_two THEN
                SELECT harvest_lag(f.pass, coalesce(g.key_clock, 0)) INTO v_lag
                FROM fair_state f
                LEFT JOIN LATERAL (SELECT g0.pass, g0.key_clock FROM fair_groups g0
                                   WHERE g0.queue = f.queue AND g0.grp = split_part(f.key, '/', 1) LIMIT 1) g ON true
                WHERE f.queue = p_queue AND f.key = r_task.fairness_key;
            ELSE
                SELECT harvest_lag(f.pass, v_clock) INTO v_lag
                FROM fair_state f WHERE f.queue = p_queue AND f.key = r_task.fairness_key;
            END IF;
        END IF;

        -- 3. The rechecks of the row's quota key. An ordinary claim waits
        -- for the quota row only in the lock order of the quota rows
        -- (harvest_bulk_quotas); 'busy': another claimer holds it and this
        -- transaction holds a later one, so the claim ends here as if no
        -- row were left (the row stays pending, for the next claim).
        v_reason := NULL;
        IF r_task.quota_key <> '' THEN
            v_reason := harvest_quota_recheck(p_queue, r_task.quota_key, v_now, NOT p_fair);
        END IF;
        IF v_reason = 'busy' THEN
            r_out.outcome := CASE WHEN v_nref > 0 THEN 'refused' ELSE 'no_task' END;
            r_out.refusals := v_ref;
            RETURN r_out;
        END IF;
        IF v_reason IS NOT NULL THEN
            v_ref := v_ref || jsonb_build_array(jsonb_build_object(
                'task_id', r_task.id, 'quota_key', r_task.quota_key, 'reason', v_reason));
            v_nref := v_nref + 1;
            v_excl := v_excl || r_task.quota_key;
            IF v_nref >= 8 OR p_task_id IS NOT NULL THEN
                r_out.outcome := 'refused';
                r_out.refusals := v_ref;
                RETURN r_out;
            END IF;
            IF p_fair THEN
                v_xkeys := v_xkeys || r_task.fairness_key;
                -- A key with a row pinned to this worker has its head among
                -- those rows (they come first for this claim): when that
                -- head carries a refused quota key, the key's other rows,
                -- pinned or not, wait behind it.
                IF harvest_pinned_waiting(p_queue, p_worker, v_now, v_due_cut) THEN
                    v_xkeys := v_xkeys || ARRAY(
                        SELECT h.fairness_key FROM (
                            SELECT DISTINCT ON (x.fairness_key) x.fairness_key, x.quota_key FROM tasks x
                            WHERE x.queue = p_queue AND x.state = 'pending' AND x.sticky_worker = p_worker
                              AND x.sticky_until > v_now AND x.due_at <= v_due_cut
                              AND x.fairness_key <> ALL (v_xkeys)
                            ORDER BY x.fairness_key,
                                     x.priority + CASE WHEN p_aging > 0
                                         THEN harvest_us(v_now, x.due_at) / (p_aging::bigint * 1000000) ELSE 0 END DESC,
                                     x.continuation DESC, x.due_at, x.id) h
                        WHERE h.quota_key = ANY (v_excl));
                END IF;
            END IF;
            CONTINUE;
        END IF;

        -- 4. Lease the row (database clock) and mark the run running. In a
        -- queue charged by runtime a fair claim bills the key's estimate
        -- and the row keeps it.
        IF p_fair THEN
            SELECT t.cost, t.step INTO v_cost, v_step
            FROM harvest_charge_terms(p_queue, r_task.fairness_key, v_runtime) t;
        END IF;
        -- The lease runs from this moment, not from the start of the
        -- transaction, which may have waited on the queue's locks for
        -- longer than a short lease.
        v_at := clock_timestamp();
        UPDATE tasks SET
            state            = 'running',
            attempt          = attempt + 1,
            lease_token      = gen_random_uuid(),
            lease_expires_at = v_at + p_lease,
            claimed_by       = p_worker,
            claimed_at       = v_at,
            charged_secs     = CASE WHEN p_fair AND v_runtime THEN v_cost END
        WHERE id = r_task.id
        RETURNING * INTO r_task;
        -- What the worker needs of the run comes back with the claim, so it
        -- reads nothing after it.
        r_run := harvest_run_claimed(r_task.run_pk, r_task.claimed_at);

        -- 5. Charge the key (fair claims only); the key's head moves on when
        -- this row was it.
        IF p_fair THEN
            PERFORM harvest_charge(p_queue, r_task.fairness_key, v_now, r_task.id, v_clock, v_cost, v_step, v_two);
        END IF;

        r_out := ROW('ok', coalesce(v_lag, 0), v_ref, r_task.id, r_task.run_pk, r_task.queue, r_task.fairness_key,
                     r_task.quota_key, r_task.priority, r_task.continuation, r_task.due_at,
                     r_task.sticky_worker, r_task.sticky_until, r_task.step, r_task.input,
                     r_task.attempt, r_task.lease_token, r_task.lease_expires_at, r_task.trace_context,
                     r_run.tenant, r_run.id, r_run.name, r_run.status, r_run.max_attempts, r_run.timeout_ms);
        RETURN r_out;
    END LOOP;
END
$$;
