-- The lag of a key (or of a group) whose pass is p_pass against the clock
-- p_clock: how far its next start tag (harvest_start_tag) lies beyond the
-- clock, 0 for one without state (NULL pass). The fair order compares
-- keys by it after priority, and every claim reports the lag of the key
-- it took. In a one-level queue the clock is the queue's V; in a
-- two-level queue a group's lag is taken against the groups' clock and a
-- key's against its group's key clock.
--
-- A LANGUAGE sql IMMUTABLE function of one expression and without a SET
-- clause, so the planner inlines it: a sort by it is a sort by the
-- expression, with no function call per row (EXPLAIN VERBOSE shows the
-- expression, and pg_stat_user_functions never counts a call of it).
CREATE OR REPLACE FUNCTION harvest_lag(p_pass double precision, p_clock double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_pass IS NULL THEN 0 ELSE harvest_start_tag(p_pass, p_clock) - p_clock END
$$;
