-- Up to p_n claims in one statement, each in the order the single claim
-- would take it; a fair batch charges the key of every row taken. A fair
-- batch takes the queue's fair lock once, so the whole batch is one turn
-- of the queue's claims; but while the queue has a single key with work
-- (harvest_queue_lone), fair batches take the lock shared and claim side
-- by side (harvest_claim_lone). Bulk steps (harvest_claim_bulk_fair,
-- harvest_claim_bulk_group in a two-level queue, harvest_claim_bulk) take
-- runs of rows at once where that gives the same result (they apply the
-- quota rechecks themselves and go on past a refused row, the fair ones
-- leaving its key out of the rest of the step and the ordinary one its
-- quota key, each later row carrying the refusals its single claim would
-- report; the two fair ones start from the refusals of the claim before
-- it: the keys of a higher priority than that claim's row all sit out;
-- the ordinary one finds earlier refusals again, since refused rows stay
-- first in the seek order); every other step is the single claim. The
-- single claim takes the rows pinned to its worker before any other, and
-- those bulk steps know nothing of pins: so while a due row pinned to
-- p_worker is pending the batch takes those rows first, by a sticky step
-- (harvest_claim_bulk_sticky: in a fair one-level queue charged per
-- claim, without ageing, up to the first pinned row with a quota key) or
-- else by single steps, and once none is left it goes on in bulk (a pinned
-- row another claimer holds keeps it on single steps, which skip that row
-- as the single claim does). An ordinary batch waits for a
-- quota row only in the lock order of the quota rows
-- (harvest_bulk_quotas): a step that meets a quota row another claimer
-- holds, out of that order, ends the batch with the rows taken before it.
-- When the batch stops early
-- with refusals, a last row with outcome 'refused' carries them; a lone
-- batch that finds, once it holds the lock, that the queue no longer has a
-- single key returns one row with outcome 'again' and nothing else, and
-- the caller sends it again (it cannot trade its shared lock for the
-- exclusive one: two batches doing so would deadlock). p_release_early:
-- see harvest_claim.
--
-- p_singles: a fair batch takes its first p_singles rows by single steps,
-- then goes on in bulk. A bulk step's plan has a fixed cost of about three
-- single steps, whatever it finds, so when only a row or two wait (the
-- caller's last batch of the queue came back short) single steps are the
-- cheaper way to take them; the rows taken are the same either way.
DROP FUNCTION IF EXISTS harvest_claim_batch(text, text, timestamptz, boolean, integer, interval, integer, boolean);
CREATE OR REPLACE FUNCTION harvest_claim_batch(p_queue text, p_worker text, p_now timestamptz, p_fair boolean,
                                               p_aging integer, p_lease interval, p_n integer,
                                               p_release_early boolean, p_singles integer DEFAULT 0)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql
-- No JIT, here and in the other entry points of the claim and the
-- completion (the setting holds for the functions they call). The generic
-- plans of their statements are costed for a whole backlog; past about a
-- million rows the estimate crosses jit_above_cost and every call compiled
-- its plan first: 200 ms of JIT for a fair bulk step that ran in 0.4 ms.
SET jit = off
-- No sequential scans, here and in the other entry points of the claim
-- (the setting holds for the functions they call). Each of the claim's
-- statements finds its rows by id, key or head through an index, but the
-- plans are kept per connection: generic plans (forced in the bulk steps,
-- settled on by the plan cache elsewhere) made on a small shard chose
-- sequential scans of tasks, and kept them as the shard grew until an
-- analyze made them anew. The single step's lease then read the whole
-- table for its one row, the fold of new arrivals and the promotion of
-- due retries hash-joined against all of it
-- (TestClaimPlansOutliveTheShardsGrowth).
SET enable_seqscan = off
AS $$
DECLARE
    r_out  harvest_claimed;
    v_left integer := p_n;
    v_got  integer;
    v_bulk boolean;
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
    v_took boolean := false;
    v_lone text;
    r_mode record;
    v_two     boolean := false;
    v_runtime boolean := false;
    -- The priority of the last row taken, and the refusals of its claim,
    -- when it had any: the next bulk step starts from them.
    v_above   integer;
    v_ref     jsonb;
    -- Bulk steps that took nothing because refused heads stood in front:
    -- how many in a row, and the single steps left before the next try.
    v_futile  integer := 0;
    v_wait    integer := 0;
    v_tried   boolean;
    -- Whether a row pinned to this worker waits, when this turn of the
    -- loop asked (NULL: not asked yet); and whether a sticky step found
    -- nothing to take in this batch (a pinned row with a quota key, say),
    -- after which the batch leaves the rest of its pinned rows to single
    -- steps rather than plan again before each of them.
    v_pin     boolean;
    v_nosticky boolean := false;
    -- Single steps still to take before the first bulk step (p_singles).
    v_singles integer := CASE WHEN p_fair THEN coalesce(p_singles, 0) ELSE 0 END;
BEGIN
    -- A paused queue hands out nothing (queue_pauses); its shared pause
    -- lock comes before every other lock of the claim.
    IF harvest_queue_pause_lock(p_queue, false) THEN
        RETURN;
    END IF;
    -- The lone case: a batch in a transaction of its own (in a caller's
    -- transaction the shared lock would outlive the statement, and a later
    -- claim of that transaction could not take the exclusive one), no
    -- ageing and no row pinned to this worker (those take single steps,
    -- which need the exclusive lock; the rest of such a batch goes in bulk
    -- steps under it), and
    -- harvest_queue_lone both before the lock and under it (a key folded in
    -- by an exclusive claim that held the lock meanwhile ends it).
    -- A queue with a fairness mode on (two-level, or charged by runtime)
    -- never takes the lone step, which charges 1 per row; the bulk steps
    -- know the runtime charge, and a two-level queue has its own.
    IF p_fair THEN
        SELECT m.two_level, m.runtime INTO v_two, v_runtime FROM harvest_fair_mode(p_queue) m;
    END IF;
    IF p_fair AND NOT (v_two OR v_runtime) AND p_release_early AND p_aging = 0 AND p_n > 1
       AND NOT harvest_pinned_waiting(p_queue, p_worker, coalesce(p_now, now()), v_due_cut) THEN
        v_lone := harvest_queue_lone(p_queue, coalesce(p_now, now()));
    END IF;
    IF v_lone IS NOT NULL THEN
        PERFORM harvest_queue_lock_shared(p_queue);
        IF harvest_queue_lone(p_queue, coalesce(p_now, now())) IS DISTINCT FROM v_lone
           OR (SELECT m.two_level OR m.runtime FROM harvest_fair_mode(p_queue) m) THEN
            r_out.outcome := 'again';
            RETURN NEXT r_out;
            RETURN;
        END IF;
        PERFORM set_config('synchronous_commit', 'off', true);
        -- Each call takes rows of one (priority, band) group of the key.
        -- Nothing to take means other batches hold every row left.
        LOOP
            RETURN QUERY SELECT * FROM harvest_claim_lone(p_queue, v_lone, p_worker, p_now, p_lease, v_left);
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            v_took := v_took OR v_got > 0;
            EXIT WHEN v_got = 0 OR v_left = 0;
        END LOOP;
        IF v_took THEN
            PERFORM set_config('harvest.flush', 'on', false);
        END IF;
        RETURN;
    END IF;
    -- Otherwise the preamble of every claim (the exclusive lock, promotion,
    -- the folds); the modes are read again under the lock, since a change
    -- of modes waits for it, and given to every single step.
    r_mode := harvest_claim_prepare(p_queue, p_now, p_fair, p_release_early);
    v_two := r_mode.two_level;
    v_runtime := r_mode.runtime;
    -- The fair bulk steps know the runtime charge; a two-level queue takes
    -- its own (harvest_claim_bulk_group).
    v_bulk := p_aging = 0;
    WHILE v_left > 0 LOOP
        v_tried := false;
        v_pin := NULL;
        -- One row is cheaper by the single claim than by a bulk plan. A
        -- bulk step only where the single claim would not take a pinned
        -- row first: none pending for this worker, due, its pin running
        -- (one probe of the partial index before every bulk step, since a
        -- start may commit a pinned row meanwhile).
        IF v_bulk AND v_left > 1 AND v_wait = 0 AND v_singles <= 0 THEN
            v_pin := harvest_pinned_waiting(p_queue, p_worker, coalesce(p_now, now()), v_due_cut);
        END IF;
        IF NOT coalesce(v_pin, true) THEN
            v_got := 0;
            IF p_fair AND v_two THEN
                -- As the one-level step below: it starts from the
                -- refusals of the claim before it, and a last row
                -- 'refused' ends the batch.
                FOR r_out IN SELECT * FROM harvest_claim_bulk_group(p_queue, p_worker, p_now, p_lease, v_left,
                                                                    v_runtime, v_above, v_ref) LOOP
                    EXIT WHEN r_out.outcome <> 'ok';
                    v_got := v_got + 1;
                    RETURN NEXT r_out;
                    v_above := CASE WHEN jsonb_array_length(r_out.refusals) > 0 THEN r_out.priority END;
                    v_ref := r_out.refusals;
                END LOOP;
                IF r_out.outcome = 'refused' THEN
                    v_took := v_took OR v_got > 0;
                    EXIT;
                END IF;
            ELSIF p_fair THEN
                -- A last row 'refused': the claim after the rows taken
                -- would have refused 8 rows; the batch ends with it.
                FOR r_out IN SELECT * FROM harvest_claim_bulk_fair(p_queue, p_worker, p_now, p_lease, v_left, v_runtime,
                                                                   v_above, v_ref) LOOP
                    EXIT WHEN r_out.outcome <> 'ok';
                    v_got := v_got + 1;
                    RETURN NEXT r_out;
                    v_above := CASE WHEN jsonb_array_length(r_out.refusals) > 0 THEN r_out.priority END;
                    v_ref := r_out.refusals;
                END LOOP;
                IF r_out.outcome = 'refused' THEN
                    v_took := v_took OR v_got > 0;
                    EXIT;
                END IF;
            ELSE
                -- A last row 'busy': the step stopped before a row whose
                -- quota row it may not wait for (harvest_bulk_quotas); the
                -- batch ends with the rows taken.
                FOR r_out IN SELECT * FROM harvest_claim_bulk(p_queue, p_worker, p_now, p_lease, v_left) LOOP
                    EXIT WHEN r_out.outcome <> 'ok';
                    v_got := v_got + 1;
                    RETURN NEXT r_out;
                END LOOP;
                IF r_out.outcome = 'busy' THEN
                    v_took := v_took OR v_got > 0;
                    EXIT;
                END IF;
            END IF;
            v_took := v_took OR v_got > 0;
            v_left := v_left - v_got;
            CONTINUE WHEN v_got > 0;
            -- Futile only when the step knew the refusals before it: one
            -- without them cannot leave out refused heads of a higher
            -- priority, and the next one can.
            v_tried := v_above IS NOT NULL;
        END IF;
        -- Rows pinned to this worker, which the single claim takes before
        -- any other: in one step when the queue's shape allows it
        -- (harvest_claim_bulk_sticky), up to the first row that needs the
        -- single claim.
        IF p_fair AND NOT v_two AND NOT v_runtime AND p_aging = 0 AND v_left > 1 AND NOT v_nosticky
           AND coalesce(v_pin, harvest_pinned_waiting(p_queue, p_worker, coalesce(p_now, now()), v_due_cut)) THEN
            v_got := 0;
            FOR r_out IN SELECT * FROM harvest_claim_bulk_sticky(p_queue, p_worker, p_now, p_lease, v_left) LOOP
                v_got := v_got + 1;
                RETURN NEXT r_out;
            END LOOP;
            IF v_got > 0 THEN
                -- As that many single claims without refusals.
                v_took := true;
                v_left := v_left - v_got;
                v_singles := v_singles - v_got;
                v_above := NULL;
                v_ref := '[]';
                v_futile := 0;
                v_wait := 0;
                CONTINUE;
            END IF;
            v_nosticky := true;
        END IF;
        r_out := harvest_claim_step(p_queue, p_worker, p_now, p_fair, p_aging, p_lease, NULL, v_two, v_runtime);
        EXIT WHEN r_out.outcome <> 'ok';
        v_singles := v_singles - 1;
        v_took := true;
        RETURN NEXT r_out;
        v_above := CASE WHEN jsonb_array_length(r_out.refusals) > 0 THEN r_out.priority END;
        v_ref := r_out.refusals;
        v_left := v_left - 1;
        -- Refused heads are never charged, so they stay in front: a bulk
        -- step that took nothing though it knew the refusals before it,
        -- followed by a single claim that met refusals again, would most
        -- likely take nothing again (many refused keys of the same
        -- priority fill its candidates). The next bulk step waits 1, 3,
        -- 7, ... single steps; a single claim without refusals ends the
        -- wait. The single steps take what the bulk steps would have, so
        -- only the cost changes.
        IF v_above IS NULL THEN
            v_futile := 0;
            v_wait := 0;
        ELSIF v_tried THEN
            v_futile := v_futile + 1;
            v_wait := (1 << least(v_futile, 16)) - 1;
        ELSIF v_wait > 0 THEN
            v_wait := v_wait - 1;
        END IF;
    END LOOP;
    IF r_out.outcome = 'refused' THEN
        RETURN NEXT r_out;
    END IF;
    IF p_fair AND p_release_early AND v_took THEN
        PERFORM set_config('harvest.flush', 'on', false);
    END IF;
END
$$;
