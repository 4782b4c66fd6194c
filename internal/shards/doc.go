// Package shards maps tenants to their home shard, and calls every shard
// at once.
//
// A tenant's runs live on one shard, chosen by rendezvous (highest random
// weight) hashing of the tenant over the shard indexes. Adding a shard moves
// only the tenants whose top score now belongs to the new shard, about 1/n of
// them; every other tenant keeps its home.
//
// Each is the one fan-out of the module: the gateway's routes, the console,
// the CLI, pkg/weights and pkg/tenantcap call every shard through it, each
// shard under its own timeout, and get one Answer per shard (its index,
// value and error). Unavailable makes the unavailable_shards list of an
// answer from them. On the wire, a write's per-shard part is
// api.ShardOutcome, made from an Answer's error by pkg/weights.
package shards
