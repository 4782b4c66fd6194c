-- Serialise the admissions of one tenant on this shard until the end of the
-- transaction. An advisory lock rather than a row lock on tenant_running:
-- the start that follows writes its run and task before it bumps
-- tenant_running, and a cancel or finish locks them in the same order, so
-- taking the tenant_running row first would invert that order and could
-- deadlock. Two tenants whose names hash alike
-- merely share a lock.
SELECT pg_advisory_xact_lock(1213346390, hashtext($1))
