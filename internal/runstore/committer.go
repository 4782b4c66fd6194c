package runstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sourcegraph/conc"

	"github.com/harvest-run/harvest/pkg/api"
)

// Defaults of CommitterOptions.
const (
	// DefaultMaxBatch keeps a group under PostgreSQL's cache of 64
	// subtransactions per transaction: every start runs under its own
	// savepoint, and a transaction with more subtransactions than the
	// cache holds makes every other session's visibility checks slower.
	DefaultMaxBatch = 48
	// DefaultFlushers lets one group execute while the previous one waits
	// for its commit to reach the disk.
	DefaultFlushers = 2
	// DefaultCommitTimeout bounds one group's transaction.
	DefaultCommitTimeout = 10 * time.Second
)

// maxTxAttempts bounds the retries of a group whose transaction the
// database broke (deadlock, serialization failure).
const maxTxAttempts = 4

// ErrClosed means the committer was closed before the start was handed in.
var ErrClosed = errors.New("runstore: committer closed")

// Admission is what an Admitter sees of one new run.
type Admission struct {
	Shard  int
	Tenant string
	// Running is the tenant's count of unfinished runs on this shard,
	// including this run. Its row is locked by the transaction until it
	// commits, so concurrent starts of the tenant on any gateway queue
	// behind it and the count is exact.
	Running int
	// Req is the validated start request.
	Req *api.StartRequest
}

// Admitter decides whether a new run may stay. It is called inside the
// start's transaction, under the start's own savepoint, after the run, its
// task and its count were written and only for new runs (a replay is never
// refused). Returning an error rolls this start back alone; an *api.Error
// (such as over_limit 429) reaches the caller as it is. Admit may run its
// own statements on tx.
type Admitter interface {
	Admit(ctx context.Context, tx pgx.Tx, a Admission) error
}

// Committed is one start of a committed group, as AfterCommit sees it.
type Committed struct {
	Params StartParams
	Result StartResult
}

// CommitterOptions tune a Committer; zero values take the defaults.
type CommitterOptions struct {
	// MaxBatch is the most starts one transaction carries.
	MaxBatch int
	// Flushers is how many groups may be in flight at once.
	Flushers int
	// Linger, when positive, is how long a flusher waits for more starts
	// after the queue ran dry, trading that much latency for larger
	// groups. Zero takes whatever arrived while the previous group
	// committed, which needs no tuning: the busier the shard, the larger
	// the groups.
	Linger time.Duration
	// Timeout bounds one group's transaction.
	Timeout time.Duration
	// Admitter, when set, is asked about every new run (see Admitter).
	// Without one, a group's starts are sent to the database in one
	// pipelined round trip; with one, one start at a time.
	Admitter Admitter
	// AfterCommit, when set, is called with the new runs of every group
	// that committed, after their callers were answered. It runs on the
	// flusher's goroutine, so it must be quick (publishing NATS messages
	// is).
	AfterCommit func([]Committed)
}

// Committer gathers concurrent starts for one shard into shared
// transactions (group commit). Each start runs under its own savepoint, so
// one that fails is rolled back alone and the others commit; every caller
// is answered once its group has committed. A shard that can commit about
// one transaction per disk flush thus takes many starts per flush.
type Committer struct {
	db    Beginner
	shard int
	opts  CommitterOptions
	queue chan *pending
	wg    conc.WaitGroup

	mu     sync.RWMutex
	closed bool
}

type pending struct {
	p     StartParams
	args  []any
	hash  []byte
	key   string // resolved fairness key, for the lock order
	res   StartResult
	found bool
	err   error
	done  chan struct{}
}

// NewCommitter starts the flushers of a committer for the shard behind
// db. Close stops them.
func NewCommitter(db Beginner, shard int, opts CommitterOptions) *Committer {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Flushers <= 0 {
		opts.Flushers = DefaultFlushers
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultCommitTimeout
	}
	c := &Committer{db: db, shard: shard, opts: opts, queue: make(chan *pending, 4*opts.MaxBatch*opts.Flushers)}
	for range opts.Flushers {
		c.wg.Go(c.flushLoop)
	}
	return c
}

// Close stops taking starts, commits those already handed in and waits
// for the flushers to end.
func (c *Committer) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.queue)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// Outcome is the result of one start of StartMany.
type Outcome struct {
	Result StartResult
	Err    error
}

// Start starts one run through the next group (see StartTx for the
// result). When ctx ends first, Start returns ctx's error, but the start
// may still commit: send it again with the same id to learn its fate.
func (c *Committer) Start(ctx context.Context, p StartParams) (StartResult, error) {
	out := c.StartMany(ctx, []StartParams{p})
	return out[0].Result, out[0].Err
}

// StartMany hands all ps in at once, so they share as few transactions as
// possible, and returns their outcomes in order.
func (c *Committer) StartMany(ctx context.Context, ps []StartParams) []Outcome {
	out := make([]Outcome, len(ps))
	items := make([]*pending, len(ps))
	c.mu.RLock()
	for i := range ps {
		it := &pending{p: ps[i], done: make(chan struct{})}
		it.args, it.hash, it.err = startArgs(&it.p)
		it.key = it.p.Req.Key()
		items[i] = it
		switch {
		case it.err != nil:
			close(it.done)
		case c.closed:
			it.err = ErrClosed
			close(it.done)
		default:
			select {
			case c.queue <- it:
			case <-ctx.Done():
				it.err = ctx.Err()
				close(it.done)
			}
		}
	}
	c.mu.RUnlock()
	for i, it := range items {
		select {
		case <-it.done:
			out[i] = Outcome{Result: it.res, Err: it.err}
		case <-ctx.Done():
			out[i] = Outcome{Err: ctx.Err()}
		}
	}
	return out
}

func (c *Committer) flushLoop() {
	for first := range c.queue {
		batch := []*pending{first}
		batch = c.gather(batch)
		c.flush(batch)
	}
}

// gather adds what is already queued, up to MaxBatch, lingering if asked.
func (c *Committer) gather(batch []*pending) []*pending {
	var linger <-chan time.Time
	for len(batch) < c.opts.MaxBatch {
		select {
		case it, ok := <-c.queue:
			if !ok {
				return batch
			}
			batch = append(batch, it)
			continue
		default:
		}
		if c.opts.Linger <= 0 {
			return batch
		}
		if linger == nil {
			t := time.NewTimer(c.opts.Linger)
			defer t.Stop()
			linger = t.C
		}
		select {
		case it, ok := <-c.queue:
			if !ok {
				return batch
			}
			batch = append(batch, it)
		case <-linger:
			return batch
		}
	}
	return batch
}

func (c *Committer) flush(items []*pending) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	var err error
	for attempt := 1; ; attempt++ {
		for _, it := range items {
			it.res, it.found, it.err = StartResult{}, false, nil
		}
		err = c.runTx(ctx, items)
		if err == nil || !retryable(err) || attempt == maxTxAttempts {
			break
		}
	}
	var committed []Committed
	for _, it := range items {
		if err != nil {
			it.res, it.err = StartResult{}, err
		} else if it.err == nil && it.res.Created {
			committed = append(committed, Committed{Params: it.p, Result: it.res})
		}
		close(it.done)
	}
	if len(committed) > 0 && c.opts.AfterCommit != nil {
		c.opts.AfterCommit(committed)
	}
}

// runTx writes the group in one transaction. An error means nothing
// committed; per-start failures are left in the items.
func (c *Committer) runTx(ctx context.Context, items []*pending) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("runstore: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(ctx, sqlTenantRunningLock, groupTenants(items)); err != nil {
		return fmt.Errorf("runstore: lock running counts: %w", err)
	}
	rest := slices.Clone(items)
	// Key summaries are locked in (queue, key) order, see TenantRunningLock.
	slices.SortFunc(rest, func(a, b *pending) int {
		return cmp.Or(cmp.Compare(a.p.Req.Queue, b.p.Req.Queue), cmp.Compare(a.key, b.key), cmp.Compare(a.p.Req.ID, b.p.Req.ID))
	})
	for len(rest) > 0 {
		n := len(rest)
		if c.opts.Admitter != nil {
			n = 1
		}
		window := rest[:n]
		rest = rest[n:]
		failed, err := c.sendWindow(ctx, tx, window)
		if err != nil {
			return err
		}
		if failed >= 0 {
			// The failed start's statement aborted the transaction and the
			// server skipped the rest of the window: undo that start alone
			// and send the others again.
			if retryable(window[failed].err) {
				return window[failed].err
			}
			if err := rollbackTo(ctx, tx); err != nil {
				return err
			}
			rest = append(window[failed+1:len(window):len(window)], rest...)
			continue
		}
		if c.opts.Admitter != nil {
			if err := c.admit(ctx, tx, window[0]); err != nil {
				return err
			}
		}
	}
	for _, it := range items {
		if it.err == nil && !it.found {
			it.res, it.err = replay(ctx, tx, &it.p, it.hash)
			if it.err != nil && !errors.Is(it.err, ErrConflict) {
				return it.err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("runstore: commit starts: %w", err)
	}
	return nil
}

// groupTenants lists the distinct tenants of a group, sorted.
func groupTenants(items []*pending) []string {
	ts := make([]string, 0, 1)
	for _, it := range items {
		ts = append(ts, it.p.Tenant)
	}
	slices.Sort(ts)
	return slices.Compact(ts)
}

// sendWindow pipelines the starts of window, each under a savepoint, in
// one round trip. It returns the index of the first start whose statement
// failed (its error is in the item), or -1.
func (c *Committer) sendWindow(ctx context.Context, tx pgx.Tx, window []*pending) (int, error) {
	release := c.opts.Admitter == nil
	b := &pgx.Batch{}
	for _, it := range window {
		b.Queue("SAVEPOINT harvest_start")
		b.Queue(sqlRunStart, it.args...)
		if release {
			b.Queue("RELEASE SAVEPOINT harvest_start")
		}
	}
	br := tx.SendBatch(ctx, b)
	failed := -1
	for i, it := range window {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return -1, fmt.Errorf("runstore: savepoint: %w", err)
		}
		it.res, it.found, it.err = scanStarted(br.QueryRow(), c.shard)
		if it.err != nil {
			failed = i
			break
		}
		if release {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return -1, fmt.Errorf("runstore: release savepoint: %w", err)
			}
		}
	}
	if err := br.Close(); err != nil && failed < 0 {
		return -1, fmt.Errorf("runstore: start batch: %w", err)
	}
	return failed, nil
}

// admit asks the Admitter about a new run and rolls it back when refused.
func (c *Committer) admit(ctx context.Context, tx pgx.Tx, it *pending) error {
	if it.found && it.res.Created {
		err := c.opts.Admitter.Admit(ctx, tx, Admission{
			Shard: c.shard, Tenant: it.p.Tenant, Running: it.res.Running, Req: &it.p.Req,
		})
		if err != nil {
			if !isAPIError(err) {
				// Not a decision but a failure (of the admitter's own
				// statements, say): the group fails and may be retried.
				return err
			}
			it.res, it.found, it.err = StartResult{}, true, err
			return rollbackTo(ctx, tx)
		}
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT harvest_start"); err != nil {
		return fmt.Errorf("runstore: release savepoint: %w", err)
	}
	return nil
}

func rollbackTo(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT harvest_start"); err != nil {
		return fmt.Errorf("runstore: roll back to savepoint: %w", err)
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT harvest_start"); err != nil {
		return fmt.Errorf("runstore: release savepoint: %w", err)
	}
	return nil
}

func isAPIError(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}

// retryable reports a transaction the database broke on purpose (deadlock,
// serialization failure): sending it again may succeed.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// Unavailable reports whether err means the shard could not be reached or
// did not answer in time (as opposed to refusing a statement): the
// gateway answers 503 to it.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Connection exceptions, operator intervention (shutdown), and
		// insufficient resources (too many connections, disk full).
		switch pe.Code[:2] {
		case "08", "53", "57":
			return pe.Code != "57014" // query_canceled: the caller's own doing
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	// SafeToRetry marks errors raised before anything reached the server,
	// such as a pooled connection found closed after the shard went away.
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
