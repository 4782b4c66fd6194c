-- The tables of the fair claim are small and rewritten by every fair claim
-- and start: their index entries pile up in front of the live ones faster
-- than autovacuum visits them (at most once a minute per database), and
-- every probe of the claim steps over them. The same holds for the rows
-- every start and finish updates (each tenant's running count, the
-- shard's admission lease and, on shard 0, the ledger). Vacuum them all
-- on each tick: they are a few pages, and this also keeps them small on a
-- server that runs without autovacuum.
VACUUM (SKIP_LOCKED) fair_state, fair_queues, fair_arrivals, tenant_running, admission_lease, admission_ledger
