-- Take the capacity ledger's lock (shard 0) until the end of the
-- transaction. Every grant takes it first, before it makes its shard's row
-- and reads the others in statements of their own, so that each grant sees
-- every earlier one, a row another grant just inserted included (a row
-- lock on the rows read would not cover a row inserted meanwhile).
CREATE OR REPLACE FUNCTION harvest_ledger_lock() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(1213346392, 0)
$$;
