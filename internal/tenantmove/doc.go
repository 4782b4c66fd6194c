// Package tenantmove places and moves tenants between shards: the steps
// of `harvest tenants pin` and `harvest tenants move`.
package tenantmove
