package tenantcap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/api"
)

// AdmitterOptions wires an Admitter to the rest of a gateway.
type AdmitterOptions struct {
	// MaxRuns is the system limit (Settings.MaxRuns); DefaultMaxRuns when
	// zero.
	MaxRuns int
	// Config returns the configuration in force; typically
	// (*Watcher).Config. DefaultConfig when nil.
	Config func() Config
	// Tenants returns the registered tenants (auth.Store.Tenants). Only
	// their number matters to the algorithms; nil counts as none.
	Tenants func() []string
	// Totals caches every shard's unfinished runs. Its shard count is the
	// one tenants are routed over. Required.
	Totals *Totals
	// RetryAfter is the hint of a refusal; DefaultRetryAfter when zero.
	RetryAfter time.Duration
	// Leases, when set, makes the system limit exact across shards: a
	// shard admits no more unfinished runs than its capacity lease, and
	// takes more from the ledger when it runs out. Its MaxRuns must be
	// MaxRuns. Without it the other shards' counts are the cached Totals,
	// which can be stale (see docs/admission.md).
	Leases *Leases
}

// Admitter decides starts. One per gateway; safe for concurrent use.
type Admitter struct {
	maxRuns    int
	config     func() Config
	tenants    func() []string
	totals     *Totals
	leases     *Leases
	retryAfter time.Duration
}

// NewAdmitter checks o and returns an Admitter.
func NewAdmitter(o AdmitterOptions) (*Admitter, error) {
	if o.Totals == nil || o.Totals.Shards() == 0 {
		return nil, errors.New("tenantcap: an Admitter needs the shard totals")
	}
	if o.MaxRuns == 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	if o.MaxRuns < 0 {
		return nil, fmt.Errorf("tenantcap: max runs %d must be positive", o.MaxRuns)
	}
	if o.Config == nil {
		o.Config = DefaultConfig
	}
	if o.Tenants == nil {
		o.Tenants = func() []string { return nil }
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	if o.Leases != nil && (o.Leases.maxRuns != o.MaxRuns || o.Leases.Shards() != o.Totals.Shards()) {
		return nil, fmt.Errorf("tenantcap: the leases cover %d shards and %d runs, the admitter %d and %d",
			o.Leases.Shards(), o.Leases.maxRuns, o.Totals.Shards(), o.MaxRuns)
	}
	return &Admitter{maxRuns: o.MaxRuns, config: o.Config, tenants: o.Tenants, totals: o.Totals,
		leases: o.Leases, retryAfter: o.RetryAfter}, nil
}

// MaxRuns is the system limit in force.
func (a *Admitter) MaxRuns() int { return a.maxRuns }

// Config is the configuration in force.
func (a *Admitter) Config() Config { return a.config() }

// Tenants is the number of registered tenants.
func (a *Admitter) Tenants() int { return len(a.tenants()) }

// Totals is the shard totals cache the Admitter reads.
func (a *Admitter) Totals() *Totals { return a.totals }

// Leases is the capacity leases the Admitter judges by (nil: none).
func (a *Admitter) Leases() *Leases { return a.leases }

// Admit implements Hook, the gateway's admission hook. The
// committer asks it inside the start's transaction on the tenant's home
// shard, after the run, its task and the tenant's count were written
// (in.Running and in.ShardRunning include the new run) and only for new
// runs, so a replay is never refused. The committer locked the tenant's
// tenant_running row before writing, and holds the lock until the group
// commits: concurrent starts of the tenant on every gateway queue behind
// it, so the count is exact and the tenant is admitted exactly up to its
// limit.
//
// It returns nil to keep the run, or an *api.Error 429 (over_limit, with
// retry_after_ms) to have the committer roll this start back alone.
func (a *Admitter) Admit(ctx context.Context, in Admission) error {
	d, err := a.Check(ctx, in)
	if err != nil {
		return err
	}
	if !d.Admit {
		return d.Err()
	}
	return nil
}

// Check is Admit returning the whole decision (for metrics and logs)
// instead of the error a refusal becomes. With Leases, a start refused
// only for want of the shard's lease makes the Admitter take more capacity
// from the ledger (see Leases.Acquire) and judge it again; the caller's
// transaction holds the shard's admission lock, so no other start can
// take that capacity first. It fails when in.Shard is not a shard of the
// totals; a lease that cannot be read or moved is an *api.Error 503.
func (a *Admitter) Check(ctx context.Context, in Admission) (Decision, error) {
	if in.Shard < 0 || in.Shard >= a.totals.Shards() {
		return Decision{}, fmt.Errorf("tenantcap: shard %d out of range (%d shards)", in.Shard, a.totals.Shards())
	}
	if in.Scheduled > 0 {
		cfg := a.config()
		if limit := ScheduledCap(cfg, a.maxRuns, len(a.tenants())); in.Scheduled > limit {
			return Decision{Reason: ReasonScheduled, Algorithm: cfg.Algorithm, TFM: cfg.TFM, MaxRuns: a.maxRuns,
				Tenants: len(a.tenants()), Own: in.Running - 1, Tenant: in.Tenant, RetryAfter: a.retryAfter,
				Scheduled: in.Scheduled, ScheduledCap: limit}, nil
		}
	}
	// Both figures include the run being admitted: judge the state before it.
	return a.judge(ctx, in.Shard, in.Tenant, in.Running-1, in.ShardRunning-1, in.ShardLease)
}

// judge decides with the shard's lease, taking more capacity when that
// alone refuses.
func (a *Admitter) judge(ctx context.Context, shard int, tenant string, own, local, lease int) (Decision, error) {
	if a.leases == nil {
		return a.decide(shard, tenant, own, local, -1), nil
	}
	d := a.decide(shard, tenant, own, local, lease)
	if d.Admit {
		return d, nil
	}
	need := a.leaseNeeded(shard, tenant, own, local)
	if need > lease {
		got, err := a.leases.Acquire(ctx, shard, need)
		if err != nil {
			return Decision{}, api.NewError(api.CodeUnavailable, "admission: could not take capacity for shard %d from shard 0; try again shortly", shard)
		}
		// Capacity only grows while the caller holds the shard's admission
		// lock (a return takes it), so the lease now is at least got.
		if d = a.decide(shard, tenant, own, local, max(got, lease)); d.Admit {
			return d, nil
		}
	}
	// Refused. The lease's bound on the other shards makes the total look
	// larger than it is; a refusal says what the system holds by the
	// cached totals when they refuse too (a tenant at its limit, a full
	// system), and what the lease left otherwise.
	if dv := a.decide(shard, tenant, own, local, -1); !dv.Admit {
		return dv, nil
	}
	return d, nil
}

// leaseNeeded is the smallest lease with which the start would be
// admitted, or 0 when no lease would do (a tenant at its Static limit).
// The decision only improves as the lease grows: a larger lease admits
// more runs on the shard and, under Dynamic, bounds the other shards'
// runs lower, which raises the tenant's limit.
func (a *Admitter) leaseNeeded(shard int, tenant string, own, local int) int {
	admits := func(lease int) bool { return a.decide(shard, tenant, own, local, lease).Admit }
	lo, hi := local+1, max(a.maxRuns, local+1)
	if !admits(hi) {
		return 0
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if admits(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// Guard implements Guarder: it bounds the counts up to which
// every new run of a group is sure to be admitted, so the committer can
// commit the group in the round trip that writes it. The bounds follow
// from Decide being monotone: a start is admitted when the total before it
// is under max_runs and the tenant's own count under its limit, and the
// limit never grows with the total. A group that goes past them is written
// again and each of its new runs judged by Admit, so the guard only has
// to be safe, never exact. It gives no guard (false) when it would let
// nothing through.
func (a *Admitter) Guard(r GuardRequest) (Guard, bool) {
	if r.Shard < 0 || r.Shard >= a.totals.Shards() || r.Scheduled > 0 {
		return Guard{}, false
	}
	others, _ := a.totals.Others(r.Shard)
	local := max(r.ShardRunning, a.totals.Snapshot()[r.Shard].Running)
	if a.leases == nil {
		return guard(a.config(), a.maxRuns, len(a.tenants()), others, local, r.Tenants, r.Starts)
	}
	// Judged as Check judges: the other shards hold at most what the
	// shard's lease leaves of max_runs. The lease is this gateway's last
	// sight of it; the statement checks the real one (Guard.Lease).
	g, ok := guard(a.config(), a.maxRuns, len(a.tenants()), max(others, a.maxRuns-a.leases.Cached(r.Shard)), local, r.Tenants, r.Starts)
	g.Lease = true
	return g, ok
}

// guard computes Guard for a group of at most starts new runs of tenants
// on a shard whose count is about local, the other shards holding others.
func guard(cfg Config, maxRuns, tenants, others, local int, groupTenants []string, starts int) (Guard, bool) {
	// With this many runs on the shard after the group, the total before
	// each of its starts is under max_runs.
	shardCap := maxRuns - others
	if cfg.Algorithm == Dynamic {
		// The tenant limit shrinks as the total grows: bound the total a
		// little above where the shard is expected to be, for a limit as
		// large as can be promised.
		shardCap = min(shardCap, local+2*starts+guardMargin)
	}
	if shardCap <= 0 {
		return Guard{}, false
	}
	g := Guard{Shard: shardCap}
	limit, limited := Limit(cfg, maxRuns, tenants, shardCap-1+others)
	if limited {
		if limit <= 0 {
			return Guard{}, false
		}
		g.Tenant = make(map[string]int, len(groupTenants))
		for _, t := range groupTenants {
			g.Tenant[t] = limit
		}
	}
	return g, true
}

// guardMargin is the room a Dynamic guard leaves for the runs other
// gateways start on the shard while a group is on its way.
const guardMargin = 16

// Admitted implements Guarder; the Admitter keeps no count.
func (a *Admitter) Admitted(int) {}

// AdmitBefore is the admission check for a start path that asks before it
// writes: call it inside the start transaction on the tenant's home shard,
// before runstore.StartTx, and commit both together (READ COMMITTED, the
// default), with shard the number of that shard. It returns what Admit
// returns; on a refusal roll the transaction back so nothing is left
// behind.
//
// It takes a transaction-scoped advisory lock that serialises the starts of
// the tenant on its shard until the transaction ends, so gateways racing
// for one tenant at its limit admit exactly up to the limit. It does not
// lock the tenant_running row itself: the start that follows writes the
// run and its task before it bumps the count, as cancels and finishes do,
// and taking the count row first would invert that order.
func (a *Admitter) AdmitBefore(ctx context.Context, tx pgx.Tx, shard int, tenant string) error {
	d, err := a.CheckBefore(ctx, tx, shard, tenant)
	if err != nil {
		return err
	}
	if !d.Admit {
		return d.Err()
	}
	return nil
}

// CheckBefore is AdmitBefore returning the whole decision.
func (a *Admitter) CheckBefore(ctx context.Context, tx pgx.Tx, shard int, tenant string) (Decision, error) {
	if shard < 0 || shard >= a.totals.Shards() {
		return Decision{}, fmt.Errorf("tenantcap: shard %d out of range (%d shards)", shard, a.totals.Shards())
	}
	b := &pgx.Batch{}
	b.Queue(sqlAdmitLock, tenant)
	b.Queue(sqlAdmitRead, tenant)
	br := tx.SendBatch(ctx, b)
	var own, local, lease int64
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&own, &local, &lease)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Decision{}, fmt.Errorf("tenantcap: read running counts: %w", err)
	}
	return a.judge(ctx, shard, tenant, int(own), int(local), int(lease))
}

// decide applies the rule to this shard's exact counts and the other
// shards' unfinished runs: their cached totals, and with a lease (lease >=
// 0) at least what the lease leaves of max_runs, which the others cannot
// exceed however they interleave. (The cached totals still count when
// they are higher: after max_runs is lowered, shards may hold more than
// it until they give capacity back.)
func (a *Admitter) decide(shard int, tenant string, own, local, lease int) Decision {
	others, _ := a.totals.Others(shard)
	if lease >= 0 {
		others = max(others, a.maxRuns-lease)
	}
	d := Decide(a.config(), a.maxRuns, len(a.tenants()), local+others, own)
	d.Tenant = tenant
	if !d.Admit {
		d.RetryAfter = a.retryAfter
	}
	return d
}

var _ Guarder = (*Admitter)(nil)
