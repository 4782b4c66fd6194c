-- The small tables that every start, claim or completion updates in place
-- (one row per tenant, per shard, per quota key) collect a dead version
-- with each update: hundreds a second at a fleet's rate. Their default
-- autovacuum waits for 20% of a table of a few rows plus 50, which is
-- soon, but page pruning can only reuse room on the row's own page, so
-- leave that room (fillfactor) and vacuum them after a fixed number of
-- dead rows, as fair_state and fair_queues are. runs is updated three to
-- four times per run (running, attempts, final): vacuum it at 2% of its
-- rows, as tasks is, rather than 20%, so that its dead versions are
-- reclaimed while they are still in the cache. See docs/reliability.md
-- ("Memory and the database over time").
ALTER TABLE tenant_running   SET (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE admission_lease  SET (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE admission_ledger SET (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE rate_buckets     SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
ALTER TABLE runs             SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
