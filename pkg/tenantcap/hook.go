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
// start path, which the Admitter of this package implements. It is asked inside the
// start's transaction, after the run, its task and its count were written,
// and only about new runs (a replay is never refused). It decides from the
// Admission alone: the committer asks it between two round trips while the
// group holds its locks, so it must be quick and must not touch the
// database. Returning an error rolls this start back alone; an *api.Error
// (such as over_limit 429) reaches the caller as it is, any other error
// fails the whole group.
type Hook interface {
	Admit(ctx context.Context, a Admission) error
}

// Guard bounds the counts up to which an Admitter admits every new run of
// a group without being asked about each one. A group written under a
// guard commits in the same round trip as it is written, provided that
// afterwards the shard holds at most Shard unfinished runs and each tenant
// listed in Tenant at most its figure (a tenant not listed is not bounded);
// otherwise it is written again and each new run is asked about. A
// negative Shard checks nothing (the committer's own guard when it has no
// Admitter).
type Guard struct {
	Shard  int
	Tenant map[string]int
	// Lease also bounds the shard's count after the group by the shard's
	// capacity lease, read by the statement itself.
	Lease bool
}

// GuardRequest describes a group about to be written.
type GuardRequest struct {
	Shard int
	// Tenants are the group's tenants; Starts is the most new runs it adds.
	Tenants []string
	Starts  int
	// ShardRunning is the shard's count of unfinished runs after the
	// committer's last group (-1 before its first): a recent lower bound
	// of what the group will find, as other gateways write too.
	ShardRunning int
	// Scheduled counts the group's starts that may not be due yet (run_at
	// or delay set): their runs are bounded by ScheduledCap, which a
	// guard does not check, so such a group is asked about start by start.
	Scheduled int
}

// Guarder is an Admitter that can promise a Guard for a group before it is
// written: every start the Guard lets through must be one Admit would have
// admitted, with the counts it would have been asked with.
type Guarder interface {
	Hook
	// Guard returns the guard for a group, or false to have every new run
	// asked about.
	Guard(GuardRequest) (Guard, bool)
	// Admitted reports the new runs a guarded group committed: they were
	// admitted without a call to Admit.
	Admitted(n int)
}
