-- Starts are the hot write path. SQL-language functions are planned again
-- on every call while PL/pgSQL ones keep their plans for the session, so the
-- task insert and the summary upsert become PL/pgSQL (same signatures and
-- results); and new tasks enter the per-key summary once per statement.

CREATE OR REPLACE FUNCTION harvest_enqueue(p_run_pk bigint, p_queue text, p_key text, p_quota_key text,
                                p_priority integer, p_continuation boolean, p_due timestamptz,
                                p_sticky_worker text, p_sticky_until timestamptz, p_step integer,
                                p_input jsonb, p_trace jsonb, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_due timestamptz := coalesce(p_due, coalesce(p_now, now()));
    v_id bigint;
BEGIN
    INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                       sticky_worker, sticky_until, step, input, trace_context)
    VALUES (p_run_pk, p_queue, p_key, p_quota_key, p_priority, p_continuation,
            CASE WHEN v_due <= v_now THEN 'pending' ELSE 'scheduled' END,
            v_due, p_sticky_worker, p_sticky_until, p_step, p_input, p_trace)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
CREATE OR REPLACE FUNCTION harvest_key_enter(p_queue text, p_key text, p_id bigint, p_prio integer,
                                  p_cont boolean, p_due timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_state AS s (queue, key, pending, head_id, head_prio, head_cont, head_due)
    VALUES (p_queue, p_key, 1, p_id, p_prio, p_cont, p_due)
    ON CONFLICT (queue, key) DO UPDATE SET
        pending   = s.pending + 1,
        head_id   = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_id   ELSE s.head_id   END,
        head_prio = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_prio ELSE s.head_prio END,
        head_cont = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_cont ELSE s.head_cont END,
        head_due  = CASE WHEN harvest_beats(p_prio, p_cont, p_due, p_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN p_due  ELSE s.head_due  END;
END
$$;

-- New rows enter the summary once per statement and key, not once per row:
-- a group of starts for one key makes one upsert of its summary row. The
-- rows of one key are counted together and the first of them in claim order
-- competes for the head. Keys are upserted in (queue, key) order, the order
-- every writer of summary rows follows.
CREATE FUNCTION harvest_tasks_summary_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_state AS s (queue, key, pending, head_id, head_prio, head_cont, head_due)
    SELECT DISTINCT ON (a.queue, a.fairness_key)
           a.queue, a.fairness_key, count(*) OVER (PARTITION BY a.queue, a.fairness_key),
           a.id, a.priority, a.continuation, a.due_at
    FROM added AS a
    WHERE a.state = 'pending'
    ORDER BY a.queue, a.fairness_key, a.priority DESC, a.continuation DESC, a.due_at, a.id
    ON CONFLICT (queue, key) DO UPDATE SET
        pending   = s.pending + excluded.pending,
        head_id   = CASE WHEN harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN excluded.head_id   ELSE s.head_id   END,
        head_prio = CASE WHEN harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN excluded.head_prio ELSE s.head_prio END,
        head_cont = CASE WHEN harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN excluded.head_cont ELSE s.head_cont END,
        head_due  = CASE WHEN harvest_beats(excluded.head_prio, excluded.head_cont, excluded.head_due, excluded.head_id, s.head_prio, s.head_cont, s.head_due, s.head_id) THEN excluded.head_due  ELSE s.head_due  END;
    RETURN NULL;
END
$$;

-- The row trigger keeps the moves out of and within the pending state.
DROP TRIGGER tasks_summary ON tasks;
CREATE TRIGGER tasks_summary
    AFTER DELETE OR UPDATE OF state, queue, fairness_key, priority, continuation, due_at ON tasks
    FOR EACH ROW EXECUTE FUNCTION harvest_tasks_summary();
CREATE TRIGGER tasks_summary_insert
    AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION harvest_tasks_summary_insert();

-- A start group written with an admission guard (see RunStartMany) stops
-- here when its counts went past what the gateway could promise to admit:
-- the group is then written again and every start judged on its own.
-- Error code HA010 (class HA is Harvest's own, see 0002_claim.sql).
CREATE FUNCTION harvest_admission_guard(p_ok boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_ok THEN
        RAISE EXCEPTION 'start group beyond its admission guard' USING ERRCODE = 'HA010';
    END IF;
    RETURN true;
END
$$;
