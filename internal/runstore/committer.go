package runstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sourcegraph/conc"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Defaults of CommitterOptions.
const (
	// DefaultMaxBatch keeps a group under PostgreSQL's cache of 64
	// subtransactions per transaction: when a group's statement fails, its
	// starts are written again each under its own savepoint, and a
	// transaction with more subtransactions than the cache holds makes
	// every other session's visibility checks slower.
	DefaultMaxBatch = 48
	// DefaultFlushers lets one group execute while the previous one waits
	// for its commit to reach the disk, when enough starts wait for two
	// groups (see intake).
	DefaultFlushers = 2
	// DefaultCommitTimeout bounds one group's transaction.
	DefaultCommitTimeout = 10 * time.Second
)

// maxTxAttempts bounds the retries of a group whose transaction the
// database broke (deadlock, serialization failure).
const maxTxAttempts = 4

// ErrClosed means the committer was closed before the start was handed in.
var ErrClosed = errors.New("runstore: committer closed")

// The admission hook of the start path is pkg/tenantcap's (one home for
// admission); these names keep it at hand here.
type (
	// Admission is what an Admitter sees of one new run.
	Admission = tenantcap.Admission
	// Admitter decides whether a new run may stay.
	Admitter = tenantcap.Hook
	// Guard bounds the counts up to which a group is admitted unasked.
	Guard = tenantcap.Guard
	// GuardRequest describes a group about to be written.
	GuardRequest = tenantcap.GuardRequest
	// Guarder is an Admitter that can promise a Guard for a group.
	Guarder = tenantcap.Guarder
)

// Committed is one start of a committed group, as AfterCommit sees it.
type Committed struct {
	Params StartParams
	Result StartResult
}

// CommitterOptions tune a Committer; zero values take the defaults.
type CommitterOptions struct {
	// MaxBatch is the most starts one transaction carries.
	MaxBatch int
	// Flushers is how many groups may be in flight at once. A group
	// beyond the first starts only once MaxBatch/4 starts wait for it.
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
	Admitter Admitter
	// AfterCommit, when set, is called with the new runs of every group
	// that committed, after their callers were answered. It runs on the
	// flusher's goroutine, so it must be quick (publishing NATS messages
	// is).
	AfterCommit func([]Committed)
}

// Committer gathers concurrent starts for one shard into shared
// transactions (group commit); every caller is answered once its group has
// committed, so a shard that commits about one transaction per disk flush
// takes many starts per flush.
//
// A group is written by one statement (RunStartMany). When the Admitter
// can promise a Guard, the count locks, that statement and the commit go in
// one round trip. Otherwise the group is written in an explicit
// transaction, each new run is judged with the counts it would have seen
// had the starts gone one at a time, refused starts are left out, and the
// rest commit. A statement error sends the group again start by start,
// each under its own savepoint, so only the failing start is lost.
//
// Each tenant is in at most one group in flight: its groups lock the
// tenant's count row, so two of them would only wait for each other.
type Committer struct {
	db    *pgxpool.Pool
	shard int
	opts  CommitterOptions
	// in is the queue the flushers share; it keeps each tenant in one
	// group at a time.
	in *intake
	wg conc.WaitGroup
	// lastShard is the shard's count after the last group (-1: none yet).
	lastShard atomic.Int64
}

type pending struct {
	p     StartParams
	row   startRow
	res   StartResult
	found bool
	err   error
	done  chan struct{}
}

// NewCommitter starts the flushers of a committer for the shard behind
// db. Close stops them.
func NewCommitter(db *pgxpool.Pool, shard int, opts CommitterOptions) *Committer {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Flushers <= 0 {
		opts.Flushers = DefaultFlushers
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultCommitTimeout
	}
	c := &Committer{db: db, shard: shard, opts: opts, in: newIntake(4*opts.MaxBatch, opts.MaxBatch/4)}
	c.lastShard.Store(-1)
	for range opts.Flushers {
		c.wg.Go(c.flushLoop)
	}
	return c
}

// Close stops taking starts, commits those already handed in and waits
// for the flushers to end.
func (c *Committer) Close() {
	c.in.close()
	c.wg.Wait()
}

// StartOutcome is the result of one start of StartMany.
type StartOutcome struct {
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
func (c *Committer) StartMany(ctx context.Context, ps []StartParams) []StartOutcome {
	out := make([]StartOutcome, len(ps))
	items := make([]*pending, len(ps))
	for i := range ps {
		it := &pending{p: ps[i], done: make(chan struct{})}
		it.row, it.err = startRowOf(&it.p)
		items[i] = it
		if it.err != nil {
			close(it.done)
			continue
		}
		closed, err := c.in.push(ctx, it)
		switch {
		case err != nil:
			it.err = err
			close(it.done)
		case closed:
			it.err = ErrClosed
			close(it.done)
		}
	}
	for i, it := range items {
		select {
		case <-it.done:
			out[i] = StartOutcome{Result: it.res, Err: it.err}
		case <-ctx.Done():
			out[i] = StartOutcome{Err: ctx.Err()}
		}
	}
	return out
}

// flushLoop writes groups until the committer is closed and drained.
func (c *Committer) flushLoop() {
	for {
		batch := c.in.take(c.opts.MaxBatch, c.opts.Linger)
		if batch == nil {
			return
		}
		c.flush(batch)
		c.in.release(batch)
	}
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
func (c *Committer) runTx(ctx context.Context, items []*pending) (err error) {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("runstore: acquire connection: %w", err)
	}
	// A connection given back inside a transaction is closed by the pool,
	// so a failed rollback leaves nothing behind.
	defer conn.Release()
	begun := false
	defer func() {
		if err != nil && begun {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	sorted := slices.Clone(items)
	// Key summaries are locked in (queue, key) order, see TenantRunningLock.
	slices.SortStableFunc(sorted, func(a, b *pending) int {
		return cmp.Or(cmp.Compare(a.p.Req.Queue, b.p.Req.Queue), cmp.Compare(a.row.key, b.row.key),
			cmp.Compare(a.p.Tenant, b.p.Tenant), cmp.Compare(a.p.Req.ID, b.p.Req.ID))
	})
	// The statement writes each (tenant, id) once; a second start of the
	// same id in the group is answered like a replay of the first.
	bulk := slices.CompactFunc(slices.Clone(sorted), func(a, b *pending) bool {
		return a.p.Tenant == b.p.Tenant && a.p.Req.ID == b.p.Req.ID
	})
	tenants := groupTenants(items)
	if guard := c.guardFor(tenants, bulk); guard != nil {
		done, err := c.writeGuarded(ctx, conn.Conn(), tenants, *guard, bulk)
		if err != nil {
			return err
		}
		if done {
			if g, ok := c.opts.Admitter.(Guarder); ok {
				g.Admitted(countNew(bulk))
			}
			return replayExisting(ctx, conn, sorted)
		}
		// Past the guard, or a start broke the statement: nothing was
		// written; do it again in a transaction that judges each start.
		resetAll(bulk)
	}
	for len(bulk) > 0 {
		stmtErr, err := c.sendBulk(ctx, conn.Conn(), !begun, tenants, bulk)
		begun = true
		if err != nil {
			return err
		}
		if stmtErr != nil {
			if retryable(stmtErr) || !isStatementError(stmtErr) {
				return stmtErr
			}
			if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT harvest_group"); err != nil {
				return fmt.Errorf("runstore: roll back to savepoint: %w", err)
			}
			resetAll(bulk)
			// One start broke the statement and the error does not say
			// which: write them one by one to find it.
			if err := c.writeEach(ctx, conn.Conn(), bulk); err != nil {
				return err
			}
			break
		}
		refused, err := c.decide(ctx, bulk)
		if err != nil {
			return err
		}
		if refused == 0 {
			break
		}
		// Write the group again without the refused starts. The counts the
		// others get then are those decide already judged them by.
		if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT harvest_group"); err != nil {
			return fmt.Errorf("runstore: roll back to savepoint: %w", err)
		}
		bulk = slices.DeleteFunc(bulk, func(it *pending) bool { return it.err != nil })
		resetAll(bulk)
	}
	if err := replayExisting(ctx, conn, sorted); err != nil {
		return err
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return fmt.Errorf("runstore: commit starts: %w", err)
	}
	begun = false
	if tag.String() != "COMMIT" {
		return errors.New("runstore: commit starts: the transaction was rolled back")
	}
	return nil
}

// guardFor returns the guard a group is written under: none (nil) when
// every new run must be asked about, an empty one when there is no
// Admitter to ask.
func (c *Committer) guardFor(tenants []string, starts []*pending) *Guard {
	switch a := c.opts.Admitter.(type) {
	case nil:
		return &Guard{Shard: -1}
	case Guarder:
		scheduled := 0
		for _, it := range starts {
			if it.p.Req.RunAt != nil || (it.p.Req.Delay != nil && *it.p.Req.Delay > 0) {
				scheduled++
			}
		}
		if g, ok := a.Guard(GuardRequest{Shard: c.shard, Tenants: tenants, Starts: len(starts),
			ShardRunning: int(c.lastShard.Load()), Scheduled: scheduled}); ok {
			return &g
		}
	}
	return nil
}

func countNew(starts []*pending) int {
	n := 0
	for _, it := range starts {
		if it.found && it.err == nil {
			n++
		}
	}
	return n
}

// replayExisting answers the starts whose id existed (none of the group's
// statements wrote them) from the stored run: a replay, or ErrConflict
// when the request differs. Any other error fails the group.
func replayExisting(ctx context.Context, db claim.DB, items []*pending) error {
	for _, it := range items {
		if it.err == nil && !it.found {
			it.res, it.err = replay(ctx, db, &it.p, it.row.hash)
			if it.err != nil && !errors.Is(it.err, ErrConflict) {
				return it.err
			}
		}
	}
	return nil
}

func resetAll(items []*pending) {
	for _, it := range items {
		it.res, it.found, it.err = StartResult{}, false, nil
	}
}

// sendBulk writes starts with RunStartMany under the savepoint
// harvest_group, in one round trip with BEGIN and the count locks of
// tenants when opening is set. stmtErr is the statement's own failure (the
// transaction then waits to be rolled back to the savepoint); err is any
// other failure.
func (c *Committer) sendBulk(ctx context.Context, conn *pgx.Conn, opening bool, tenants []string, starts []*pending) (stmtErr, err error) {
	b := &pgx.Batch{}
	if opening {
		b.Queue("BEGIN")
		b.Queue(sqlTenantRunningLock, tenants)
	}
	b.Queue("SAVEPOINT harvest_group")
	b.Queue(sqlRunStartMany, append(manyArgs(starts), guardArgs(nil)...)...)
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil && stmtErr == nil {
			err = fmt.Errorf("runstore: start group: %w", cerr)
		}
	}()
	if opening {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("runstore: begin: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("runstore: lock running counts: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("runstore: savepoint: %w", err)
	}
	got, err := readStarted(br)
	if err != nil {
		return err, nil
	}
	return nil, c.settle(got, starts)
}

// writeGuarded writes a group under a guard in one round trip and one
// implicit transaction (a pipeline up to its Sync commits as a whole):
// the count locks, then the starts. done reports that it committed. When
// the guard stopped the group, or a start broke the statement, nothing
// was written and done is false: the caller writes the group again in a
// transaction that judges each start. err is any other failure.
func (c *Committer) writeGuarded(ctx context.Context, conn *pgx.Conn, tenants []string, g Guard, starts []*pending) (done bool, err error) {
	b := &pgx.Batch{}
	b.Queue(sqlTenantRunningLock, tenants)
	b.Queue(sqlRunStartMany, append(manyArgs(starts), guardArgs(&g)...)...)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return false, fmt.Errorf("runstore: lock running counts: %w", err)
	}
	got, stmtErr := readStarted(br)
	// Close reads the end of the pipeline, where the commit happens.
	cerr := br.Close()
	if stmtErr == nil {
		stmtErr = cerr
	}
	if stmtErr != nil {
		if retryable(stmtErr) || !isStatementError(stmtErr) {
			return false, fmt.Errorf("runstore: start group: %w", stmtErr)
		}
		return false, nil
	}
	return true, c.settle(got, starts)
}

// settle hands a statement's rows to their starts and remembers the
// shard's count for the next guard.
func (c *Committer) settle(got []startedRow, starts []*pending) error {
	if err := settleStarted(got, starts, c.shard); err != nil {
		return err
	}
	if len(got) > 0 {
		c.lastShard.Store(int64(got[0].shardBefore + len(got)))
	}
	return nil
}

// readStarted reads the rows of RunStartMany from a batch.
func readStarted(br pgx.BatchResults) ([]startedRow, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var got []startedRow
	for rows.Next() {
		r, err := scanStartedMany(rows)
		if err != nil {
			return nil, err
		}
		got = append(got, r)
	}
	return got, rows.Err()
}

// guardArgs are the guard parameters of RunStartMany (nil: no check).
func guardArgs(g *Guard) []any {
	if g == nil || g.Shard < 0 {
		return []any{[]string(nil), []int64(nil), nil, false}
	}
	tenants := make([]string, 0, len(g.Tenant))
	caps := make([]int64, 0, len(g.Tenant))
	for t, n := range g.Tenant {
		tenants = append(tenants, t)
		caps = append(caps, int64(n))
	}
	return []any{tenants, caps, int64(g.Shard), g.Lease}
}

// decide asks the Admitter about the new runs of a written group, in the
// order they were written. A refused start is marked with its error; the
// starts after it are judged by the counts they will have once it is
// rolled back, as if the starts had run one after the other. It returns
// how many were refused.
func (c *Committer) decide(ctx context.Context, starts []*pending) (int, error) {
	if c.opts.Admitter == nil {
		return 0, nil
	}
	refused := 0
	byTenant, scheduledByTenant := map[string]int{}, map[string]int{}
	for _, it := range starts {
		if !it.found || it.err != nil {
			continue
		}
		a := Admission{
			Shard: c.shard, Tenant: it.p.Tenant, Req: &it.p.Req,
			Running:      it.res.Running - byTenant[it.p.Tenant],
			ShardRunning: it.res.ShardRunning - refused,
			ShardLease:   it.res.ShardLease,
		}
		if it.res.Scheduled > 0 {
			a.Scheduled = it.res.Scheduled - scheduledByTenant[it.p.Tenant]
		}
		err := c.opts.Admitter.Admit(ctx, a)
		if err == nil {
			continue
		}
		if !isAPIError(err) {
			// Not a decision but a failure: the group fails and may be
			// retried.
			return 0, err
		}
		if it.res.Scheduled > 0 {
			scheduledByTenant[it.p.Tenant]++
		}
		it.res, it.err = StartResult{}, err
		byTenant[it.p.Tenant]++
		refused++
	}
	return refused, nil
}

// writeEach writes the starts one by one, each under a savepoint of its
// own, pipelined in windows: a start that fails is rolled back alone and
// the starts after it are sent again.
func (c *Committer) writeEach(ctx context.Context, conn *pgx.Conn, starts []*pending) error {
	rest := starts
	for len(rest) > 0 {
		cut, err := c.sendWindow(ctx, conn, rest)
		if err != nil {
			return err
		}
		if cut < 0 {
			return nil
		}
		// The start at cut failed or was refused: undo it, and with it the
		// starts sent after it (the server skipped them after a failure,
		// and their counts included it after a refusal), then send those
		// again.
		if retryable(rest[cut].err) || !isStatementError(rest[cut].err) {
			return rest[cut].err
		}
		if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint(cut)); err != nil {
			return fmt.Errorf("runstore: roll back to savepoint: %w", err)
		}
		rest = rest[cut+1:]
		resetAll(rest)
	}
	return nil
}

// savepoint names the savepoint of the i-th start of a window. Names are
// reused from window to window: a newer savepoint hides an older one of the
// same name, which is the one a rollback must reach.
func savepoint(i int) string { return "harvest_start_" + strconv.Itoa(i) }

// groupTenants lists the distinct tenants of a group, sorted.
func groupTenants(items []*pending) []string {
	ts := make([]string, 0, 1)
	for _, it := range items {
		ts = append(ts, it.p.Tenant)
	}
	slices.Sort(ts)
	return slices.Compact(ts)
}

// sendWindow writes the starts of window, each under a savepoint of its
// own, in one pipelined round trip, and asks the Admitter about the new
// runs in order. It returns the index of the first start that failed or
// was refused (its error is in the item), or -1 when all of them stand.
func (c *Committer) sendWindow(ctx context.Context, conn *pgx.Conn, window []*pending) (int, error) {
	b := &pgx.Batch{}
	for i, it := range window {
		b.Queue("SAVEPOINT " + savepoint(i))
		b.Queue(sqlRunStart, it.row.args()...)
	}
	br := conn.SendBatch(ctx, b)
	cut := -1
	for i, it := range window {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return -1, fmt.Errorf("runstore: savepoint: %w", err)
		}
		it.res, it.found, it.err = scanStarted(br.QueryRow(), c.shard)
		if it.err != nil {
			cut = i
			break
		}
	}
	if err := br.Close(); err != nil && cut < 0 {
		return -1, fmt.Errorf("runstore: start batch: %w", err)
	}
	if cut >= 0 || c.opts.Admitter == nil {
		return cut, nil
	}
	for i, it := range window {
		if !it.found {
			continue
		}
		err := c.opts.Admitter.Admit(ctx, Admission{
			Shard: c.shard, Tenant: it.p.Tenant, Running: it.res.Running, ShardRunning: it.res.ShardRunning,
			ShardLease: it.res.ShardLease, Scheduled: it.res.Scheduled, Req: &it.p.Req,
		})
		if err == nil {
			continue
		}
		if !isAPIError(err) {
			return -1, err
		}
		it.res, it.found, it.err = StartResult{}, true, err
		return i, nil
	}
	return -1, nil
}

// isStatementError reports a start refused by the server or the Admitter,
// as opposed to a connection that failed under it.
func isStatementError(err error) bool {
	var pe *pgconn.PgError
	return isAPIError(err) || errors.As(err, &pe)
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
