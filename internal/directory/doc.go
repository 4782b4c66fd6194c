// Package directory records where each tenant's runs live.
//
// The record is the table tenant_homes on shard 0. A tenant met for the
// first time is placed by rendezvous hashing over the shards of the
// caller (internal/shards.Home) and recorded; from then on the record
// decides, so a shard added to HARVEST_SHARDS takes only tenants that are
// new, or moved there on purpose (`harvest tenants move`).
//
// Every gateway keeps the entries it has used in a Directory, a cache that
// is told of changes over NATS and re-reads what changed on shard 0 every
// refresh interval, so a lost message costs at most one interval. The
// cache is never trusted to keep runs in place: a shard that is no longer
// a tenant's home refuses its starts (tenant_fences), and the gateway then
// reads the entry again.
package directory
