-- HA020 when the tenant has moved to another shard (tenant_fences). Sent
-- after the tenant's count row is locked, so it sees a fence raised by any
-- move that held that lock before this start.
SELECT harvest_tenant_fence(ARRAY[$1::text])
