package tenantcap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/jackc/pgx/v5"
)

// Capacity leases make the system limit exact across shards. The ledger on
// shard 0 divides max_runs among the shards; each shard judges its starts,
// under its admission lock, against the capacity it holds (its lease), so
// the shards' unfinished runs can never add up to more than max_runs
// whatever the interleaving, and no start waits on another shard unless
// its own shard has run out. Both sides keep two totals that only grow
// (granted, returned) and a transfer raises one side's total to the
// other's, so a transfer applied twice or late changes nothing, and a
// crash between the two steps of a transfer loses capacity until the next
// Sync instead of creating it. See docs/admission.md.

// Defaults of LeasesOptions.
const (
	// DefaultLeaseInterval is how often Run takes in unapplied transfers
	// and gives back idle capacity.
	DefaultLeaseInterval = time.Second
	// DefaultLeaseTimeout bounds one transfer's statements.
	DefaultLeaseTimeout = 2 * time.Second
)

// LeasesOptions configures Leases.
type LeasesOptions struct {
	// Shards are the shard databases in shard order; Shards[0] holds the
	// ledger. Required.
	Shards []shard.Beginner
	// MaxRuns is the capacity the ledger divides (DefaultMaxRuns when
	// zero). Every gateway must use the same.
	MaxRuns int
	// Block is the least capacity a shard is granted at a time, so most
	// starts find capacity at hand (zero: max_runs over four times the
	// shards, and all of max_runs with one shard).
	Block int
	// Interval is Run's period (DefaultLeaseInterval when zero).
	Interval time.Duration
	// Timeout bounds each transfer (DefaultLeaseTimeout when zero).
	Timeout time.Duration
}

// Leases moves capacity between the ledger on shard 0 and the shards.
// One per gateway; safe for concurrent use, and any number of gateways may
// move capacity at once.
type Leases struct {
	dbs      []shard.Beginner
	maxRuns  int
	block    int
	interval time.Duration
	timeout  time.Duration

	mu     sync.Mutex
	cached []int // each shard's lease as last seen
}

// NewLeases checks o and returns Leases.
func NewLeases(o LeasesOptions) (*Leases, error) {
	if len(o.Shards) == 0 {
		return nil, errors.New("tenantcap: leases need at least one shard")
	}
	if o.MaxRuns == 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	if o.MaxRuns < 0 {
		return nil, fmt.Errorf("tenantcap: max runs %d must be positive", o.MaxRuns)
	}
	if o.Block < 0 {
		return nil, fmt.Errorf("tenantcap: lease block %d must not be negative", o.Block)
	}
	if o.Block == 0 {
		o.Block = o.MaxRuns
		if n := len(o.Shards); n > 1 {
			o.Block = max(1, (o.MaxRuns+4*n-1)/(4*n))
		}
	}
	if o.Interval <= 0 {
		o.Interval = DefaultLeaseInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultLeaseTimeout
	}
	return &Leases{dbs: o.Shards, maxRuns: o.MaxRuns, block: o.Block, interval: o.Interval,
		timeout: o.Timeout, cached: make([]int, len(o.Shards))}, nil
}

// ErrLeaseUnavailable wraps a failure to move capacity (shard 0 or the
// shard could not be reached in time).
var ErrLeaseUnavailable = errors.New("tenantcap: capacity lease unavailable")

// LeaseState is one shard's lease as read from it.
type LeaseState struct {
	// Granted and Returned are the shard's two totals; the lease is their
	// difference.
	Granted  int64 `db:"granted"`
	Returned int64 `db:"returned"`
	// Running is the shard's count of unfinished runs.
	Running int64 `db:"running"`
}

// Lease is the capacity the shard holds.
func (s LeaseState) Lease() int { return int(s.Granted - s.Returned) }

// ledgerRow is one shard's account in the ledger.
type ledgerRow struct {
	Shard    int   `db:"shard"`
	Granted  int64 `db:"granted"`
	Returned int64 `db:"returned"`
}

// Shards is the number of shards.
func (l *Leases) Shards() int { return len(l.dbs) }

// Block is the least capacity granted at a time.
func (l *Leases) Block() int { return l.block }

// Cached is the shard's lease as this gateway last saw it: a hint for
// guards, which the start statement checks against the real one.
func (l *Leases) Cached(shard int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cached[shard]
}

func (l *Leases) remember(shard int, s LeaseState) {
	l.mu.Lock()
	l.cached[shard] = s.Lease()
	l.mu.Unlock()
}

// Acquire makes the shard's lease at least need, if the ledger can spare
// it, and returns the lease then (smaller than need when it could not).
// seen is the shard's count of unfinished runs that need was worked out
// from: starts the shard admitted since then used capacity the caller
// did not count on, so need grows by as many (a caller that holds the
// shard's admission lock, or read the count just now, passes that count).
// It grants at least a block at a time. When the ledger is short it first
// takes back the idle capacity of the other shards. It may be called
// while the caller holds the shard's admission lock: it never waits on
// another shard's.
func (l *Leases) Acquire(ctx context.Context, shard, seen, need int) (int, error) {
	if shard < 0 || shard >= len(l.dbs) {
		return 0, fmt.Errorf("tenantcap: shard %d out of range (%d shards)", shard, len(l.dbs))
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	// Starts of one group after the one that took capacity ask again with
	// the lease their statement read: one read answers them.
	st, err := l.State(ctx, shard)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrLeaseUnavailable, err)
	}
	// Two start groups of a shard can both be short by the same count:
	// without this the second would find the first's capacity, already
	// spent, and ask for none.
	need += max(0, int(st.Running)-seen)
	if st.Lease() >= need {
		return st.Lease(), nil
	}
	if st, err = l.syncFrom(ctx, shard, st); err != nil {
		return 0, err
	}
	reclaimed := false
	for range 4 {
		if st.Lease() >= need {
			return st.Lease(), nil
		}
		granted, ok, err := l.grant(ctx, shard, need, st.Returned)
		if err != nil {
			return st.Lease(), err
		}
		if ok {
			st, err = l.take(ctx, shard, granted)
			if err != nil {
				return st.Lease(), err
			}
			continue
		}
		if reclaimed || len(l.dbs) == 1 {
			return st.Lease(), nil
		}
		// The ledger cannot spare it: take back what the other shards do
		// not use, and try once more.
		reclaimed = true
		for t := range l.dbs {
			if t != shard {
				if _, err := l.GiveBack(ctx, t, 0); err != nil && !errors.Is(err, errLockBusy) {
					return st.Lease(), err
				}
			}
		}
	}
	return st.Lease(), nil
}

// grant makes the shard's account in the ledger hold at least need,
// granting a block or more at a time when capacity is free. The account,
// not the shard's lease, is the base: a grant to the shard by another
// gateway that the shard has not taken in yet counts, or two Acquires of
// one shard would each ask for the whole shortfall and the second find
// too little free. returned is the shard's own total returned, which may
// be ahead of the ledger's until the ledger takes the return in. ok is
// false when not even the shortfall is free; granted is the shard's total
// granted afterwards.
func (l *Leases) grant(ctx context.Context, shard, need int, returned int64) (granted int64, ok bool, err error) {
	err = pgx.BeginFunc(ctx, l.dbs[0], func(tx pgx.Tx) error {
		// The lock, the row and the read each in a statement of its own:
		// the read's snapshot is taken after the lock, so it holds every
		// grant committed before, whatever rows they inserted.
		if _, err := tx.Exec(ctx, sqlLedgerLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlLedgerEnsure, shard); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sqlLedgerRead)
		ledger, err := collectLedger(rows, err)
		if err != nil {
			return err
		}
		held, own := int64(0), ledgerRow{}
		for _, r := range ledger {
			held += r.Granted - r.Returned
			if r.Shard == shard {
				own = r
			}
		}
		short := int64(need) - (own.Granted - max(own.Returned, returned))
		if short <= 0 {
			ok, granted = true, own.Granted
			return nil
		}
		free := int64(l.maxRuns) - held
		if free < short {
			return nil
		}
		ok = true
		return tx.QueryRow(ctx, sqlLedgerGrant, shard, min(max(short, int64(l.block)), free)).Scan(&granted)
	})
	if err != nil {
		return 0, false, fmt.Errorf("%w: grant to shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	return granted, ok, nil
}

// take raises the shard's granted total to the ledger's.
func (l *Leases) take(ctx context.Context, shard int, granted int64) (LeaseState, error) {
	rows, err := l.dbs[shard].Query(ctx, sqlLeaseTakeGrant, granted)
	st, err := collectLease(rows, err)
	if err != nil {
		return LeaseState{}, fmt.Errorf("%w: take in a grant on shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	l.remember(shard, st)
	return st, nil
}

func collectLease(rows pgx.Rows, err error) (LeaseState, error) {
	if err != nil {
		return LeaseState{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[LeaseState])
}

// errLockBusy reports a shard whose admission lock was held: its idle
// capacity was not given back this time.
var errLockBusy = errors.New("tenantcap: the shard's admission lock is busy")

// GiveBack returns the shard's unused capacity beyond keep to the ledger
// and returns the shard's state afterwards. It does not wait for the
// shard's admission lock: when a start holds it, nothing is given back and
// the error matches errLockBusy.
func (l *Leases) GiveBack(ctx context.Context, shard, keep int) (LeaseState, error) {
	var st LeaseState
	err := pgx.BeginFunc(ctx, l.dbs[shard], func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, sqlLeaseTryLock).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return errLockBusy
		}
		rows, err := tx.Query(ctx, sqlLeaseGiveBack, keep)
		st, err = collectLease(rows, err)
		return err
	})
	if errors.Is(err, errLockBusy) {
		return LeaseState{}, err
	}
	if err != nil {
		return LeaseState{}, fmt.Errorf("%w: give back on shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	l.remember(shard, st)
	if _, err := l.dbs[0].Exec(ctx, sqlLedgerTakeReturn, shard, st.Returned); err != nil {
		// The shard gave it back; the ledger takes it in at the next Sync.
		return st, fmt.Errorf("%w: take in a return from shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	return st, nil
}

// Sync finishes every transfer of the shard that a crash or a failure
// left half done: the shard takes in what the ledger granted it, and the
// ledger what the shard gave back. It returns the shard's state.
func (l *Leases) Sync(ctx context.Context, shard int) (LeaseState, error) {
	st, err := l.State(ctx, shard)
	if err != nil {
		return LeaseState{}, fmt.Errorf("%w: sync shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	return l.syncFrom(ctx, shard, st)
}

// syncFrom is Sync for a shard whose state st was just read (Acquire has
// read it already).
func (l *Leases) syncFrom(ctx context.Context, shard int, st LeaseState) (LeaseState, error) {
	fail := func(err error) (LeaseState, error) {
		return LeaseState{}, fmt.Errorf("%w: sync shard %d: %w", ErrLeaseUnavailable, shard, err)
	}
	rows, err := l.dbs[0].Query(ctx, sqlLedgerRead)
	ledger, err := collectLedger(rows, err)
	if err != nil {
		return fail(err)
	}
	var acct ledgerRow
	for _, r := range ledger {
		if r.Shard == shard {
			acct = r
		}
	}
	// st may be older than the ledger's row: both sides only grow and
	// are raised to each other's figure, so an older st costs at most a
	// write that changes nothing, or a return taken in at the next sync.
	if acct.Granted > st.Granted {
		if st, err = l.take(ctx, shard, acct.Granted); err != nil {
			return LeaseState{}, err
		}
	}
	if st.Returned > acct.Returned {
		if _, err := l.dbs[0].Exec(ctx, sqlLedgerTakeReturn, shard, st.Returned); err != nil {
			return fail(err)
		}
	}
	return st, nil
}

func collectLedger(rows pgx.Rows, err error) ([]ledgerRow, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[ledgerRow])
}

// Tidy runs one round of Run: every shard syncs, and a shard holding more
// than two blocks it does not use gives back all but one block (with one
// shard nothing is given back: no other shard could use it). It returns
// the failures joined.
func (l *Leases) Tidy(ctx context.Context) error {
	var errs []error
	for s := range l.dbs {
		sctx, cancel := context.WithTimeout(ctx, l.timeout)
		st, err := l.Sync(sctx, s)
		if err == nil && len(l.dbs) > 1 && int64(st.Lease())-st.Running > int64(2*l.block) {
			if _, err = l.GiveBack(sctx, s, l.block); errors.Is(err, errLockBusy) {
				err = nil
			}
		}
		cancel()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run calls Tidy now and then every interval until ctx ends. onError, when
// set, sees each failed round (for logs).
func (l *Leases) Run(ctx context.Context, onError func(error)) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		if err := l.Tidy(ctx); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Ledger reads every shard's account from the ledger: what each holds by
// the ledger's count, whose sum never exceeds max_runs.
func (l *Leases) Ledger(ctx context.Context) ([]int, error) {
	rows, err := l.dbs[0].Query(ctx, sqlLedgerRead)
	ledger, err := collectLedger(rows, err)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: read the ledger: %w", err)
	}
	out := make([]int, len(l.dbs))
	for _, r := range ledger {
		if r.Shard < len(out) {
			out[r.Shard] = int(r.Granted - r.Returned)
		}
	}
	return out, nil
}

// State reads the shard's lease and count.
func (l *Leases) State(ctx context.Context, shard int) (LeaseState, error) {
	rows, err := l.dbs[shard].Query(ctx, sqlLeaseRead)
	st, err := collectLease(rows, err)
	if err != nil {
		return LeaseState{}, fmt.Errorf("tenantcap: read the lease of shard %d: %w", shard, err)
	}
	l.remember(shard, st)
	return st, nil
}
