-- The shard's unfinished runs over all tenants: what sum(running) over
-- tenant_running gives, read from the seventeen rows of shard_running
-- that the trigger on tenant_running keeps (harvest_running_total).
-- A statement sees the count as of its snapshot, its own changes left
-- out, as a sum over tenant_running would.
-- (PL/pgSQL, so that its plan is kept from call to call: a SQL function
-- that reads a table cannot be inlined and is planned on every call.)
CREATE OR REPLACE FUNCTION harvest_shard_running() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT sum(s.added) - sum(s.removed) FROM shard_running AS s), 0);
END
$$;
