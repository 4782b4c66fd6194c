-- Serialise the admissions of the shard, then of one tenant on it, until
-- the end of the transaction: the shard's admission lock first, as every
-- start takes it (harvest_shard_admission_lock), so the shard's count and
-- its capacity lease read next hold until the commit. The tenant's is an
-- advisory lock rather than a row lock on tenant_running: the start that
-- follows writes its run and task before it bumps tenant_running, and a
-- cancel or finish locks them in the same order, so taking the
-- tenant_running row first would invert that order and could deadlock.
-- Two tenants whose names hash alike merely share a lock.
SELECT harvest_shard_admission_lock(), pg_advisory_xact_lock(1213346390, hashtext($1))
