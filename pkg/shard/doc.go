// Package shard names what Harvest's packages need of a connection to a
// shard's database: a Querier to run statements and a Beginner to open
// transactions. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy both, so a
// caller passes whichever it holds: a pool to let each call take its own
// connection and commit at once, a transaction to have the call's writes
// commit with the caller's.
package shard
