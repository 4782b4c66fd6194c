// Package shards maps tenants to their home shard.
//
// A tenant's runs live on one shard, chosen by rendezvous (highest random
// weight) hashing of the tenant over the shard indexes. Adding a shard moves
// only the tenants whose top score now belongs to the new shard, about 1/n of
// them; every other tenant keeps its home.
package shards
