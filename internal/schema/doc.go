// Package schema holds the SQL of a Harvest shard and applies it.
//
// The schema has two parts. Migrations (migrations/NNNN_name.sql) create
// tables, types and indexes; they are numbered in the order they apply,
// applied once each, and additive, so binaries of the previous release keep
// working against a migrated shard during a rolling upgrade. Functions and
// triggers (functions/<name>.sql, one function per file, with the trigger
// that calls it when there is one) are written as CREATE OR REPLACE and
// applied after the migrations whenever their text changed, so each SQL
// function has exactly one definition in the tree.
package schema
