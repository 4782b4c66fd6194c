package tenantcap

import (
	"context"

	"github.com/harvest-run/harvest/pkg/api"
)

// Admission is what a Hook sees of one new run.
type Admission struct {
	Shard  int
	Tenant string
	// Running is the tenant's count of unfinished runs on this shard,
	// including this run. Its row is locked by the transaction until it
	// commits, so concurrent starts of the tenant on any gateway queue
	// behind it and the count is exact.
	Running int
	// ShardRunning is the shard's count of unfinished runs over all
	// tenants, including this run, as the start's statement read it.
	ShardRunning int
	// ShardLease is the shard's capacity lease (see Leases), read after the
	// shard's admission lock, which every return of capacity also takes:
	// it cannot shrink before the start commits.
	ShardLease int
	// Scheduled is the tenant's count of runs not due yet on this shard,
	// including this run, when this run is not due yet; 0 when it is due.
	// It is read under the same lock as Running, so it is exact.
	Scheduled int
	// Req is the validated start request.
	Req *api.StartRequest
}

// Hook decides whether a new run may stay: the admission hook of the
// start path, which the Admitter of this package implements. It is asked
// inside the start's transaction, after the run, its task and its count
// were written, and only about new runs (a replay is never refused). It
// decides from the Admission alone: the committer asks it between two
// round trips while the group holds its locks, so it must be quick and
// must not touch the database. Returning an error rolls this start back
// alone; an *api.Error (such as over_limit 429) reaches the caller as it
// is, any other error fails the whole group. A Hook that is also a Ruler
// is not asked about a start group's runs: the statement that writes the
// group decides them by its Rule (the deferred starts and retries still
// ask Admit).
type Hook interface {
	Admit(ctx context.Context, a Admission) error
}
