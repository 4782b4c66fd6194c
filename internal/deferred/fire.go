package deferred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Bounds of one Fire call; what is left waits for the next call.
const (
	// DefaultFireLimit is how many due groups one Fire call looks at.
	DefaultFireLimit = 1000
	// throttlePass is how many waiting starts of one throttle key a firing
	// pass locks and reschedules.
	throttlePass = 1000
)

// group is a pending group locked by the caller's transaction.
type group struct {
	PK      int64         `db:"pk"`
	Tenant  string        `db:"tenant"`
	RunID   string        `db:"run_id"`
	Mode    api.DeferMode `db:"mode"`
	Request []byte        `db:"request"`
	Input   []byte        `db:"input"`
	Trace   []byte        `db:"trace_context"`
}

// lockGroup locks a pending group with sqlGroupLock (skipping one another
// firer holds) or sqlGroupLockHeld (waiting); nil when it is not pending.
func lockGroup(ctx context.Context, tx pgx.Tx, sql string, pk int64) (*group, error) {
	rows, err := tx.Query(ctx, sql, pk)
	if err != nil {
		return nil, fmt.Errorf("deferred: lock group: %w", err)
	}
	g, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[group])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("deferred: lock group: %w", err)
	}
	return g, nil
}

// lockWaitingRun locks the run row a group will replace and reports
// whether it still waits (status deferred). A missing row is the zero
// waitingRun, not waiting.
func lockWaitingRun(ctx context.Context, tx pgx.Tx, tenant, runID string) (waitingRun, bool, error) {
	rows, err := tx.Query(ctx, sqlRunDeferredLock, tenant, runID)
	if err != nil {
		return waitingRun{}, false, fmt.Errorf("deferred: lock deferred run: %w", err)
	}
	run, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[waitingRun])
	if errors.Is(err, pgx.ErrNoRows) {
		return waitingRun{}, false, nil
	}
	if err != nil {
		return waitingRun{}, false, fmt.Errorf("deferred: lock deferred run: %w", err)
	}
	return run, run.Status == api.StatusDeferred, nil
}

// waitingRun is what RunDeferredLock reads of a run.
type waitingRun struct {
	PK     int64      `db:"pk"`
	Status api.Status `db:"status"`
	// Notify: the run's end is announced (runs.notify). The waiting row
	// gathers it from every start of its group and from long polls on it,
	// so the run that replaces it takes it from here.
	Notify bool `db:"notify"`
}

// fire starts the run of a locked pending group, in tx: the waiting run
// row gives way to the real run, written by runstore.StartTx (run, first
// task, count), the slot the waiting run held passes to it, and the group
// is marked fired. A group whose run was cancelled while it waited is
// closed instead, and fire returns nil.
func fire(ctx context.Context, tx pgx.Tx, shard int, g *group, now time.Time) (*runstore.Committed, error) {
	waiting, live, err := lockWaitingRun(ctx, tx, g.Tenant, g.RunID)
	if err != nil {
		return nil, err
	}
	if !live {
		if _, err := tx.Exec(ctx, sqlGroupSetState, g.PK, stateCancelled, now); err != nil {
			return nil, fmt.Errorf("deferred: close cancelled group: %w", err)
		}
		return nil, nil
	}
	var req api.StartRequest
	if err := json.Unmarshal(g.Request, &req); err != nil {
		return nil, fmt.Errorf("deferred: decode stored request: %w", err)
	}
	req.ID = g.RunID
	req.Notify = waiting.Notify
	if g.Mode == api.ModeBatch {
		req.Input = g.Input
	}
	if _, err := tx.Exec(ctx, sqlRunDeferredDelete, waiting.PK); err != nil {
		return nil, fmt.Errorf("deferred: remove deferred run: %w", err)
	}
	p := runstore.StartParams{Tenant: g.Tenant, Shard: shard, Req: req, TraceContext: g.Trace, Fired: true}
	res, err := runstore.StartTx(ctx, tx, p)
	if err != nil {
		return nil, fmt.Errorf("deferred: start fired run: %w", err)
	}
	if !res.Created {
		return nil, fmt.Errorf("deferred: fired run %q was not created", g.RunID)
	}
	if _, err := tx.Exec(ctx, sqlTenantRunningRelease, g.Tenant); err != nil {
		return nil, fmt.Errorf("deferred: hand the slot over: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlGroupSetState, g.PK, stateFired, now); err != nil {
		return nil, fmt.Errorf("deferred: mark group fired: %w", err)
	}
	return &runstore.Committed{Params: p, Result: res}, nil
}

// FireOptions tune a Fire call; zero values take the defaults.
type FireOptions struct {
	// Shard is the index of the shard behind db, for the run resources in
	// the report.
	Shard int
	// Now is the time to fire at; zero means the database clock.
	Now time.Time
	// Limit is how many due groups the call looks at (DefaultFireLimit).
	Limit int
}

// FireReport counts what a Fire call did.
type FireReport struct {
	// Fired is the number of runs started.
	Fired int
	// Cancelled counts groups closed because their run was cancelled
	// while it waited.
	Cancelled int
	// Busy counts groups and throttle keys another firer held, or whose
	// transaction the database broke (deadlock): the next call tries again.
	Busy int
	// Started lists the runs started, for the caller to announce.
	Started []runstore.Committed
}

// Fire starts the runs of the groups due at o.Now on the shard behind db:
// debounce windows whose quiet period (or max_wait) ended, batches whose
// max_wait passed, and the waiting throttled starts their key's limit now
// lets through, in arrival order. Each group, and each throttle key, is
// fired in a transaction of its own; groups and keys that another firer
// holds are skipped, so any number of Fire calls may run at once on one
// shard and every group fires exactly once.
func Fire(ctx context.Context, db shard.Beginner, o FireOptions) (FireReport, error) {
	var rep FireReport
	if o.Limit <= 0 {
		o.Limit = DefaultFireLimit
	}
	q := db
	now := o.Now
	if now.IsZero() {
		var err error
		if now, err = dbNow(ctx, q); err != nil {
			return rep, err
		}
	}
	type due struct {
		PK     int64  `db:"pk"`
		Tenant string `db:"tenant"`
		Mode   string `db:"mode"`
		Queue  string `db:"queue"`
		Key    string `db:"key"`
	}
	rows, err := q.Query(ctx, sqlGroupDue, now, o.Limit)
	if err != nil {
		return rep, fmt.Errorf("deferred: find due groups: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[due])
	if err != nil {
		return rep, fmt.Errorf("deferred: find due groups: %w", err)
	}
	type keyID struct{ tenant, queue, key string }
	seen := map[keyID]bool{}
	var errs []error
	for _, d := range list {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		var err error
		if d.Mode == string(api.ModeThrottle) {
			k := keyID{d.Tenant, d.Queue, d.Key}
			if seen[k] {
				continue
			}
			seen[k] = true
			err = inTx(ctx, db, &rep, func(tx pgx.Tx, r *FireReport) error {
				return throttleKey(ctx, tx, o.Shard, d.Tenant, d.Queue, d.Key, now, r)
			})
		} else {
			err = inTx(ctx, db, &rep, func(tx pgx.Tx, r *FireReport) error {
				if _, err := tx.Exec(ctx, sqlTenantRunningLock, d.Tenant); err != nil {
					return fmt.Errorf("deferred: lock running count: %w", err)
				}
				g, err := lockGroup(ctx, tx, sqlGroupLock, d.PK)
				if err != nil || g == nil {
					return err
				}
				return fireInto(ctx, tx, o.Shard, g, now, r)
			})
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

// fireInto fires g and counts the outcome in r.
func fireInto(ctx context.Context, tx pgx.Tx, shard int, g *group, now time.Time, r *FireReport) error {
	started, err := fire(ctx, tx, shard, g, now)
	if err != nil {
		return err
	}
	if started == nil {
		r.Cancelled++
		return nil
	}
	r.Fired++
	r.Started = append(r.Started, *started)
	return nil
}

// inTx runs fn in a transaction of its own and adds what it counted to rep
// once it committed. A transaction the database broke on purpose counts as
// busy, not as an error.
func inTx(ctx context.Context, db shard.Beginner, rep *FireReport, fn func(pgx.Tx, *FireReport) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("deferred: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	var r FireReport
	err = fn(tx, &r)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		if dberr.Retryable(err) {
			rep.Busy++
			return nil
		}
		return err
	}
	rep.Fired += r.Fired
	rep.Cancelled += r.Cancelled
	rep.Busy += r.Busy
	rep.Started = append(rep.Started, r.Started...)
	return nil
}

// throttleKey is one firing pass over a throttle key: its waiting starts,
// in arrival order, fire while the key's window has room; those that must
// still wait get the slot they can now expect.
func throttleKey(ctx context.Context, tx pgx.Tx, shard int, tenant, queue, key string, now time.Time, r *FireReport) error {
	if _, err := tx.Exec(ctx, sqlTenantRunningLock, tenant); err != nil {
		return fmt.Errorf("deferred: lock running count: %w", err)
	}
	var got bool
	if err := tx.QueryRow(ctx, sqlThrottleTryLock, tenant, queue, key).Scan(&got); err != nil {
		return fmt.Errorf("deferred: lock throttle key: %w", err)
	}
	if !got {
		r.Busy++
		return nil
	}
	type waiting struct {
		PK      int64     `db:"pk"`
		FiresAt time.Time `db:"fires_at"`
		Limit   int       `db:"throttle_limit"`
		Period  int64     `db:"period_us"`
	}
	rows, err := tx.Query(ctx, sqlThrottlePendingLock, tenant, queue, key, throttlePass)
	if err != nil {
		return fmt.Errorf("deferred: lock throttled starts: %w", err)
	}
	pending, err := pgx.CollectRows(rows, pgx.RowToStructByName[waiting])
	if err != nil {
		return fmt.Errorf("deferred: lock throttled starts: %w", err)
	}
	if len(pending) == 0 {
		return nil
	}
	// The key's limit and period are those of its oldest waiting start.
	limit, period := pending[0].Limit, time.Duration(pending[0].Period)*time.Microsecond
	fired, err := collectTimes(ctx, tx, sqlThrottleFired, tenant, queue, key, now, period.Microseconds(), limit)
	if err != nil {
		return err
	}
	seq := reversed(fired)
	var movePK []int64
	var moveAt []time.Time
	for _, w := range pending {
		slot := nextSlot(seq, limit, period, now)
		if slot.After(now) {
			if !slot.Equal(w.FiresAt) {
				movePK, moveAt = append(movePK, w.PK), append(moveAt, slot)
			}
			seq = append(seq, slot)
		} else {
			g, err := lockGroup(ctx, tx, sqlGroupLockHeld, w.PK)
			if err != nil {
				return err
			}
			if g != nil {
				before := r.Fired
				if err := fireInto(ctx, tx, shard, g, now, r); err != nil {
					return err
				}
				if r.Fired > before {
					seq = append(seq, now)
				}
			}
		}
		if len(seq) > limit {
			seq = seq[len(seq)-limit:]
		}
	}
	if len(movePK) > 0 {
		if _, err := tx.Exec(ctx, sqlGroupReschedule, movePK, moveAt); err != nil {
			return fmt.Errorf("deferred: reschedule throttled starts: %w", err)
		}
	}
	return nil
}

// DefaultPruneBatch bounds one Prune call.
const DefaultPruneBatch = 5000

// Prune deletes groups that are done and needed no longer (at now): a
// throttled start's once its run left the key's window, a debounce
// window's or batch's once its run was deleted by retention, with its
// member starts. It returns how many groups it deleted (at most limit).
func Prune(ctx context.Context, db shard.Querier, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		limit = DefaultPruneBatch
	}
	var n int
	if err := db.QueryRow(ctx, sqlGroupPrune, now, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("deferred: prune groups: %w", err)
	}
	return n, nil
}
