// Package runstore keeps runs in a shard: starting one (the run, its first
// task and the tenant's running count in one transaction, idempotent on the
// run id), reading, listing and cancelling runs as the API's run resource.
//
// The gateway starts runs through a Committer, which groups concurrent
// starts for a shard into shared transactions (group commit), so one disk
// flush carries many starts. A group is written by one statement
// (RunStartMany); under an admission Guard it commits in the same round
// trip, otherwise each new run is put to the Admitter with the counts it
// would have had alone. A refused start is rolled back alone, and a start
// the database refuses is isolated by writing the group start by start,
// each under a savepoint. The Committer's flushers share one queue that
// keeps each tenant in one group at a time (intake.go). Start and StartTx
// write a single start.
//
// Cancel takes a run's tasks out of play by marking them done. It touches
// no fairness state: a key head that pointed at a cancelled task is stale,
// which the next fair claim of the queue repairs (docs/claim.md), and a
// running task loses its lease token, so its worker's next heartbeat or
// completion is refused.
// Workers finish runs through pkg/claim, which updates the same rows.
package runstore
