-- Take down the tenant's fence on this shard: the tenant (back) home here.
DELETE FROM tenant_fences WHERE tenant = $1
