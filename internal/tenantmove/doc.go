// Package tenantmove places and moves tenants between shards: the steps
// of `harvest tenants pin`, `harvest tenants move` and the listing of
// homes. A move changes a tenant's home while the tenant keeps working.
//
// A move is a sequence of small transactions, each on one shard, driven by
// the tenant's entry in the directory (tenant_homes on shard 0), which
// records how far the move got. Every step can be repeated, so running the
// move again after a crash at any point finishes it. In outline: fence the
// old home (no start of the tenant can land there any more), carry the
// tenant's fairness debts, weights, quotas and counts to the new home, move
// the deferred starts, make the new home the one gateways write to, then
// copy the runs over in batches (hide them from the old home's claimers,
// copy, delete), and finally settle the counts. See sql/*.sql for the
// statements and move.go for the order.
package tenantmove
