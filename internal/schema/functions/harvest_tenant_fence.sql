-- Refuse to write runs of a tenant whose home this shard no longer is
-- (tenant_fences): HA020, with the shard the tenant went to as the
-- error's detail, so the gateway can look up the new home and send the
-- start there. Called by every statement that writes new runs, after the
-- start took its lock on the tenant's count row (see tenant_fences).
CREATE OR REPLACE FUNCTION harvest_tenant_fence(p_tenants text[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f record;
BEGIN
    SELECT tenant, moved_to INTO f FROM tenant_fences WHERE tenant = ANY (p_tenants) ORDER BY tenant LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'tenant % has moved to shard %', f.tenant, f.moved_to
            USING ERRCODE = 'HA020', DETAIL = f.moved_to::text, HINT = f.tenant;
    END IF;
    RETURN true;
END
$$;
