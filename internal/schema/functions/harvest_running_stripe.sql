-- The row of shard_running that the falls of a tenant's count go to:
-- one of sixteen, by a hash of the tenant (rises all go to stripe 0, see
-- migration 0012). Spreading the falls keeps completion batches of
-- different tenants from queuing on one row.
CREATE OR REPLACE FUNCTION harvest_running_stripe(p_tenant text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (1 + (hashtext(p_tenant) & 15))::smallint
$$;
