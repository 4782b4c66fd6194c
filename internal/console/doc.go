// Package console reads what the gateway's browser console shows: runs
// across every shard, one run with its tasks, queue depths by state and
// the claims of each fairness key over the last minutes. It only reads;
// the console's actions go through the same paths as the API.
package console
