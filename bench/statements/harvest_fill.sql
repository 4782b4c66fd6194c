-- The flood of harvest-bench fleet, written as its fill writes it: one run
-- and one pending task per row, one tenant, one key (:rows of them).
ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert;
INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash, status, notify)
SELECT 'flood', 'flood-' || g, 'echo', 'fleet', 'flood', '\x00', 'queued', false
FROM generate_series(1, :rows) g;
INSERT INTO tasks (run_pk, queue, fairness_key, state)
SELECT pk, 'fleet', 'flood', 'pending' FROM runs ORDER BY pk;
ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert;
SELECT harvest_fair_repair('fleet');
INSERT INTO tenant_running (tenant, running) VALUES ('flood', :rows);
VACUUM ANALYZE runs;
VACUUM ANALYZE tasks;
VACUUM ANALYZE fair_state;
CHECKPOINT;
