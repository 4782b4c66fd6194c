// Package schema holds the SQL migrations of a Harvest shard and applies them.
//
// Migrations are plain SQL files embedded in the binary and numbered in the
// order they apply. They are additive, so binaries of the previous release
// keep working against a migrated shard during a rolling upgrade.
package schema
