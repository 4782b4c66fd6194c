-- Serialise the decisions about one throttle key (tenant, queue, key) until
-- the transaction ends: accepts and firings of the key take turns.
SELECT pg_advisory_xact_lock(hashtextextended('harvest.throttle' || chr(1) || $1 || chr(1) || $2 || chr(1) || $3, 0))
