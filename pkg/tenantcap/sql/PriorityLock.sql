-- Serialise the writers of tenant_priority for the transaction, so that a
-- count of its rows holds until the write that depends on it commits.
SELECT pg_advisory_xact_lock(hashtext('harvest_tenant_priority'))
