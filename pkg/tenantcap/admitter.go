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

// Admit implements Hook, the admission hook of the starts that are
// written one at a time (deferred starts, their firing, retries): it is
// asked inside the start's transaction on the tenant's home shard, after
// the run, its task and the tenant's count were written (in.Running and
// in.ShardRunning include the new run) and only for new runs, so a replay
// is never refused. The transaction holds the shard's admission lock and
// the tenant's tenant_running row until it commits: concurrent starts of
// the tenant on every gateway queue behind it, so the count is exact and
// the tenant is admitted exactly up to its limit. (A start group is not
// asked: its statement judges its runs by Rule, the same decision.)
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
	// Both figures include the run being admitted: judge the state before it.
	return a.judge(ctx, in.Shard, in.Tenant, in.Running-1, in.ShardRunning-1, in.ShardLease, in.Scheduled)
}

// judge decides by the rule in force, taking more capacity when the
// shard's lease alone refuses.
func (a *Admitter) judge(ctx context.Context, shard int, tenant string, own, local, lease, scheduled int) (Decision, error) {
	r, err := a.Rule(shard)
	if err != nil {
		return Decision{}, err
	}
	d, more := r.Judge(tenant, local, own, lease, scheduled)
	if !more {
		return d, nil
	}
	need := r.LeaseNeeded(local, own)
	if need <= lease {
		return d, nil
	}
	got, err := a.Acquire(ctx, shard, local, need)
	if err != nil {
		return Decision{}, err
	}
	// Capacity only grows while the caller holds the shard's admission
	// lock (a return takes it), so the lease now is at least got. Still
	// refused, d is the refusal the larger lease gives.
	d, _ = r.Judge(tenant, local, own, max(got, lease), scheduled)
	return d, nil
}

// Rule implements Ruler: the rule new runs on shard are judged by now
// (the configuration in force, the registered tenants, the other shards'
// cached totals). It fails when shard is not a shard of the totals.
func (a *Admitter) Rule(shard int) (Rule, error) {
	if shard < 0 || shard >= a.totals.Shards() {
		return Rule{}, fmt.Errorf("tenantcap: shard %d out of range (%d shards)", shard, a.totals.Shards())
	}
	others, _ := a.totals.Others(shard)
	return Rule{Config: a.config(), MaxRuns: a.maxRuns, Tenants: len(a.tenants()), Others: others,
		Leased: a.leases != nil, RetryAfter: a.retryAfter}, nil
}

// Acquire implements Ruler: it makes the shard's lease at least need,
// grown by the runs the shard admitted since it held seen (Leases.Acquire),
// and returns the lease then. Without Leases there is no lease to grow and
// it returns 0. A failure is an *api.Error 503.
func (a *Admitter) Acquire(ctx context.Context, shard, seen, need int) (int, error) {
	if a.leases == nil {
		return 0, nil
	}
	got, err := a.leases.Acquire(ctx, shard, seen, need)
	if err != nil {
		return 0, api.NewError(api.CodeUnavailable, "admission: could not take capacity for shard %d from shard 0; try again shortly", shard)
	}
	return got, nil
}

// Decided implements Ruler; the Admitter keeps no count.
func (a *Admitter) Decided(int, []Decision) {}

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
	var c admitCounts
	_, err := br.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			c, err = pgx.CollectOneRow(rows, pgx.RowToStructByName[admitCounts])
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Decision{}, fmt.Errorf("tenantcap: read running counts: %w", err)
	}
	return a.judge(ctx, shard, tenant, c.Own, c.Local, c.Lease, 0)
}

var _ Ruler = (*Admitter)(nil)

// admitCounts is the row of AdmitRead: the tenant's unfinished runs on the
// shard (with those still on its old home during a move), the shard's and
// the shard's capacity lease.
type admitCounts struct {
	Own   int `db:"own"`
	Local int `db:"local"`
	Lease int `db:"lease"`
}
