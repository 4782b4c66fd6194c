-- One janitor per shard and tick does the exclusive jobs; the lock ends
-- with the transaction.
SELECT pg_try_advisory_xact_lock(hashtext('harvest.janitor'))
