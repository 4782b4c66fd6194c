-- The start tag of the next claim of a key (or of a group) whose pass is
-- p_pass, against the clock p_clock: max(pass, clock), and the clock
-- itself for one without state (NULL pass). A claim's charge starts there
-- and moves the pass one step beyond it (harvest_charge_terms: cost /
-- weight); the single charge (harvest_charge) and the lone and bulk steps
-- of a batch all take their starts from here. A LANGUAGE sql IMMUTABLE
-- function of one expression and without a SET clause, so the planner
-- inlines it where it is used.
CREATE OR REPLACE FUNCTION harvest_start_tag(p_pass double precision, p_clock double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_pass IS NULL THEN p_clock ELSE greatest(p_pass, p_clock) END
$$;
