// Package runstore keeps runs in a shard: starting one (the run, its first
// task and the tenant's running count in one transaction, idempotent on the
// run id) and reading it back as the API's run resource.
//
// The gateway calls Start for every start it admits; workers finish runs
// through pkg/claim, which updates the same rows.
package runstore
