-- The run a retry puts back in its queue, locked: its handle, status,
-- whether a tenant move holds it (move_out), and whether it ever had a
-- task (a deferred start cancelled before it fired never did). The caller
-- holds the shard's admission lock and the tenant's count row already
-- (TenantRunningLock); harvest_tenant_fence refuses a tenant that moved
-- away (HA020) after that lock, as the start statement does.
SELECT r.pk,
       r.status,
       EXISTS (SELECT 1 FROM move_out m WHERE m.run_pk = r.pk) AS moving,
       EXISTS (SELECT 1 FROM tasks t WHERE t.run_pk = r.pk) AS has_task
FROM runs r
WHERE r.tenant = $1 AND r.id = $2 AND harvest_tenant_fence(ARRAY[$1::text])
FOR UPDATE OF r
