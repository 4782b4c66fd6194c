// Package migrate creates and upgrades the schema of a Harvest shard, for
// a Go service that embeds Harvest (a worker of its own, say) and cannot
// run the harvest binary's migrate command.
//
// Up applies the migrations a shard lacks and then the SQL functions, in
// one transaction under an advisory lock, so that several processes may
// call it at once at start. Migrations are additive: binaries of the
// previous release keep working against a migrated shard. Status lists
// what a shard has applied and what it lacks. Run Up on every shard.
package migrate
