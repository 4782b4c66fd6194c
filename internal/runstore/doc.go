// Package runstore keeps runs in a shard: starting one (the run, its first
// task and the tenant's running count in one transaction, idempotent on the
// run id), reading, listing and cancelling runs as the API's run resource.
//
// The gateway starts runs through a Committer, which groups concurrent
// starts for a shard into shared transactions (group commit), so one disk
// flush carries many starts. A group is one call of harvest_start_group
// (RunStartGroup), which decides admission for each new run with the rule
// the admission hook gives (a tenantcap.Ruler) and writes the admitted ones; it
// commits without waiting for the flush, so its locks are free at once,
// and the callers are answered after a flush wait in the same round trip.
// A hook that is only a tenantcap.Hook is asked in Go about each new run of the
// group as written, and the group is written again without the refused
// ones. A start the database refuses fails alone. The Committer's flushers
// share one queue that keeps each tenant in one group until that group
// commits (intake.go). Start and StartTx write a single start.
//
// Cancel takes a run's tasks out of play by marking them done. It touches
// no fairness state: a key head that pointed at a cancelled task is stale,
// which the next fair claim of the queue repairs (docs/claim.md), and a
// running task loses its lease token, so its worker's next heartbeat or
// completion is refused.
// Workers finish runs through pkg/claim, which updates the same rows.
package runstore
