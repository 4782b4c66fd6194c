-- The tables of the fair claim are small and rewritten by every fair claim
-- and start: their index entries pile up in front of the live ones faster
-- than autovacuum visits them (at most once a minute per database), and
-- every probe of the claim steps over them. Vacuum them on each tick.
VACUUM (SKIP_LOCKED) fair_state, fair_queues, fair_arrivals
