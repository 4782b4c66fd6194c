// Package testfactory makes the rows tests start from: runs (counted for
// their tenant, as a start counts them) and their tasks (through the same
// enqueue function as every start, so the fair claim's key summaries are
// kept). Tests that need a shape no start would write, such as rows that
// bypass the triggers, write their own SQL.
package testfactory
