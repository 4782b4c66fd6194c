// Package runstore keeps runs in a shard: starting one (the run, its first
// task and the tenant's running count in one transaction, idempotent on the
// run id), reading, listing and cancelling runs as the API's run resource.
//
// The gateway starts runs through a Committer, which groups concurrent
// starts for a shard into shared transactions with a savepoint per start
// (group commit), so one disk flush carries many starts and a failing start
// is rolled back alone. Start and StartTx do the same for one start.
//
// Cancel takes a run's tasks out of play by marking them done: the schema's
// trigger on tasks (harvest_tasks_summary, which calls harvest_key_leave)
// keeps the fair claim's per-key summary exact, and a running task loses
// its lease token, so its worker's next heartbeat or completion is refused.
// Workers finish runs through pkg/claim, which updates the same rows.
package runstore
