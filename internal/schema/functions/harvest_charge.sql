-- Charge a key for an accepted fair claim of row p_took, with p_clock the
-- queue clock V, p_cost what the claim costs and p_step how far it moves
-- the key's pass, both read by harvest_charge_terms (cost: 1 in a queue
-- charged per claim, the key's runtime estimate in seconds in a queue
-- charged by runtime; step: cost / w, with w the key's override, read at
-- the claim, so a weight change applies at the key's next claim). start =
-- the key's start tag (harvest_start_tag: max(pass, V), V for a key
-- without state), last_start = start, pass = start + step. When p_took was
-- the key's head, the head moves on to the key's next pending row in the
-- same update. When the clock moves, every key it caught up with loses its
-- debt mark, so in_debt stays exactly pass > V. Returns the new clock. The
-- caller holds the queue's fair lock.
--
-- In a two-level queue (p_two_level) a key's start is taken against its
-- group's key clock instead of V (the groups compete among themselves
-- first), and the claim is charged to the group too: its start is its
-- start tag against the groups' clock, its pass moves p_cost/gw beyond,
-- and the key clock keeps the largest start of the group's keys. V still
-- follows every key's start, so switching back to one level finds it where
-- it should be.
DROP FUNCTION IF EXISTS harvest_charge(text, text, timestamptz, bigint, double precision);
DROP FUNCTION IF EXISTS harvest_charge(text, text, timestamptz, bigint, double precision, double precision, boolean);
CREATE OR REPLACE FUNCTION harvest_charge(p_queue text, p_key text, p_now timestamptz, p_took bigint,
                                          p_clock double precision, p_cost double precision,
                                          p_step double precision, p_two_level boolean) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    v_start  double precision;
    v_base   double precision := p_clock;
    v_pass   double precision;
    v_grp    text;
    v_gw     double precision;
    v_gclock double precision;
    v_gstart double precision;
    r_f      fair_state%ROWTYPE;
    r_g      fair_groups%ROWTYPE;
    r_head   record;
BEGIN
    IF p_two_level THEN
        v_grp := split_part(p_key, '/', 1);
        SELECT * INTO r_g FROM fair_groups WHERE queue = p_queue AND grp = v_grp;
        v_base := coalesce(r_g.key_clock, 0);
    END IF;
    SELECT * INTO r_f FROM fair_state WHERE queue = p_queue AND key = p_key;
    IF NOT FOUND THEN
        -- A key whose arrival was never folded (its state was lost): its
        -- head is read from the index.
        SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, NULL, NULL, NULL, NULL);
        v_start := v_base;
        v_pass := v_start + p_step;
        INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt,
                                head_id, head_prio, head_cont, head_due)
        VALUES (p_queue, p_key, v_pass, v_start, p_now, v_pass > greatest(v_start, p_clock),
                r_head.head_id, r_head.head_prio, r_head.head_cont, r_head.head_due);
    ELSE
        v_start := harvest_start_tag(r_f.pass, v_base);
        v_pass := v_start + p_step;
        IF r_f.head_id = p_took THEN
            SELECT * INTO r_head FROM harvest_key_head(p_queue, p_key, r_f.head_prio, r_f.head_cont,
                                                       r_f.head_due, r_f.head_id);
            UPDATE fair_state SET
                last_start = v_start,
                pass       = v_pass,
                charged_at = p_now,
                in_debt    = v_pass > greatest(v_start, p_clock),
                head_id    = r_head.head_id,
                head_prio  = r_head.head_prio,
                head_cont  = r_head.head_cont,
                head_due   = r_head.head_due
            WHERE queue = p_queue AND key = p_key;
        ELSE
            UPDATE fair_state SET
                last_start = v_start,
                pass       = v_pass,
                charged_at = p_now,
                in_debt    = v_pass > greatest(v_start, p_clock)
            WHERE queue = p_queue AND key = p_key;
        END IF;
    END IF;
    IF p_two_level THEN
        SELECT weight INTO v_gw FROM group_weights WHERE queue = p_queue AND grp = v_grp;
        v_gw := coalesce(v_gw, 1);
        SELECT group_clock INTO v_gclock FROM fair_queues WHERE queue = p_queue;
        v_gclock := coalesce(v_gclock, 0);
        v_gstart := harvest_start_tag(r_g.pass, v_gclock);
        INSERT INTO fair_groups AS g (queue, grp, pass, last_start, charged_at, key_clock)
        VALUES (p_queue, v_grp, v_gstart + p_cost / v_gw, v_gstart, p_now, v_start)
        ON CONFLICT (queue, grp) DO UPDATE SET
            pass = excluded.pass, last_start = excluded.last_start, charged_at = excluded.charged_at,
            key_clock = greatest(g.key_clock, excluded.key_clock);
        IF v_gstart > v_gclock THEN
            INSERT INTO fair_queues AS q (queue, clock, group_clock) VALUES (p_queue, 0, v_gstart)
            ON CONFLICT (queue) DO UPDATE SET group_clock = greatest(q.group_clock, excluded.group_clock);
        END IF;
    END IF;
    IF v_start > p_clock THEN
        PERFORM harvest_clock_advance(p_queue, v_start);
    END IF;
    RETURN greatest(v_start, p_clock);
END
$$;
