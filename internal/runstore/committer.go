package runstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sourcegraph/conc"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Defaults of CommitterOptions.
const (
	// DefaultMaxBatch keeps a group under PostgreSQL's cache of 64
	// subtransactions per transaction: when the database refuses a start
	// of a group, the group's statement writes its starts again each in a
	// block of its own (a subtransaction), and a transaction with more
	// subtransactions than the cache holds makes every other session's
	// visibility checks slower.
	DefaultMaxBatch = 48
	// DefaultFlushers lets one group execute while the previous one waits
	// for its commit to reach the disk, when enough starts wait for two
	// groups (see intake).
	DefaultFlushers = 2
	// DefaultCommitTimeout bounds one group's transaction.
	DefaultCommitTimeout = 10 * time.Second
)

// maxTxAttempts bounds the retries of a group whose transaction the
// database broke (deadlock, serialization failure: dberr.Conflict). The
// start, cancel and retry paths retry on a conflict only, not on a write
// refused by a server that stopped being the primary (dberr.Retryable
// adds that): such a request is answered 503 with Retry-After
// (dberr.Unavailable), as docs/operations.md and the reliability table
// promise, and the client's retry reaches the new primary. A group holds
// the starts of many callers, and a retry in place would hold them all
// while the shard changes primary.
const maxTxAttempts = 4

// maxLeaseRounds bounds how many groups a start is sent in while its
// shard takes capacity for it: other starts of the shard may use up what
// was taken before it gets there. A batch split over groups that commit
// at once is the usual case; each take also covers what the others
// admitted since its statement (Leases.Acquire), so one more round is
// rarely needed, but three proved too few for two groups (a start the
// last round still finds short is refused as if the system were full).
const maxLeaseRounds = 8

// ErrClosed means the committer was closed before the start was handed in.
var ErrClosed = errors.New("runstore: committer closed")

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
	// Admitter, when set, is the admission hook that decides every new
	// run. A hook that is also a tenantcap.Ruler (the gateway's, over
	// tenantcap.Admitter) has its rule applied by the statement that
	// writes the group; any other hook is asked in Go about each new run
	// of the group as first written, and the group is written again
	// without the runs it refused. Without one every start is admitted.
	Admitter tenantcap.Hook
	// AfterCommit, when set, is called with the new runs of every group
	// that committed, after their callers were answered. It runs on the
	// flusher's goroutine, so it must be quick (publishing NATS messages
	// is).
	AfterCommit func([]Committed)
}

// Committer gathers concurrent starts for one shard into shared
// transactions (group commit); every caller is answered once its group has
// committed and its commit reached the disk, so a shard that commits about
// one transaction per disk flush takes many starts per flush.
//
// A group is one call of harvest_start_group, which decides admission for
// each new run with the counts it would have had had the starts been sent
// one at a time, writes the admitted ones and returns each start's fate.
// The transaction commits with synchronous_commit off, in the same round
// trip, so the shard's admission lock and the tenants' count rows are held
// for the statement and not for its flush; the callers are answered after
// a synchronous no-op transaction that follows in that round trip
// (RunStartFlush) has waited for the flush. Another group, or a completion
// batch of the same tenants, commits meanwhile.
//
// Each tenant is in at most one group until that group commits: its
// groups lock the tenant's count row, so two of them would only wait for
// each other; once it committed, the tenant's next group may be written
// while it waits for its flush.
type Committer struct {
	db    *pgxpool.Pool
	shard int
	opts  CommitterOptions
	// in is the queue the flushers share; it keeps each tenant in one
	// group at a time until that group commits.
	in *intake
	wg conc.WaitGroup
	// committed, when set (tests), is called when a group's transaction
	// has committed, before the wait for its flush.
	committed func()
}

type pending struct {
	p   StartParams
	row startRow
	res StartResult
	err error
	// st is what the group's statement said of the start; rep is the
	// start of the group that carries its (tenant, id) (itself, or the
	// first start of the same id, which this one is a replay of).
	st   startedRow
	rep  *pending
	done chan struct{}
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

// flush writes items as a group, and as many more groups as the starts
// refused for want of the shard's capacity take (see round).
func (c *Committer) flush(items []*pending) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	// Once the group committed, its tenants' next starts may go in the
	// next group while this one waits for its flush.
	free := sync.OnceFunc(func() { c.in.unhold(items) })
	for round := 1; len(items) > 0; round++ {
		items = c.round(ctx, items, round == maxLeaseRounds, free)
	}
}

// group is the starts of one transaction.
type group struct {
	// sent holds one start per (tenant, id), in the order the statement
	// decides them: by queue, key, tenant and id, so that the same starts
	// always meet the limits in the same order.
	sent []*pending
	// tenants are the group's tenants, distinct and sorted.
	tenants []string
	// skip marks the starts of sent a Go hook refused (nil: none).
	skip []bool
	// committed, when set, is called when the transaction committed,
	// before the wait for its flush.
	committed func()
}

func newGroup(items []*pending) *group {
	sorted := slices.Clone(items)
	slices.SortStableFunc(sorted, func(a, b *pending) int {
		return cmp.Or(cmp.Compare(a.p.Req.Queue, b.p.Req.Queue), cmp.Compare(a.row.key, b.row.key),
			cmp.Compare(a.p.Tenant, b.p.Tenant), cmp.Compare(a.p.Req.ID, b.p.Req.ID))
	})
	g := &group{}
	for i, it := range sorted {
		it.st, it.rep = startedRow{}, it
		if i > 0 {
			if prev := sorted[i-1]; prev.p.Tenant == it.p.Tenant && prev.p.Req.ID == it.p.Req.ID {
				// The statement writes each (tenant, id) once; a second
				// start of the id is answered like a replay of the first.
				it.rep = prev.rep
				continue
			}
		}
		g.sent = append(g.sent, it)
		g.tenants = append(g.tenants, it.p.Tenant)
	}
	slices.Sort(g.tenants)
	g.tenants = slices.Compact(g.tenants)
	return g
}

// round writes items as one group, answers every start it settled and
// returns those to send again: refused for want of the shard's capacity,
// which was then taken (never on the last round). onCommit is called
// once the group's transaction committed.
func (c *Committer) round(ctx context.Context, items []*pending, last bool, onCommit func()) []*pending {
	g := newGroup(items)
	g.committed = onCommit
	ruler, _ := c.opts.Admitter.(tenantcap.Ruler)
	var (
		rule   tenantcap.Rule
		closed error // refuses every new run: the Ruler has no rule now
	)
	if ruler != nil {
		var err error
		if rule, err = ruler.Rule(c.shard); err != nil {
			if !isAPIError(err) {
				c.fail(items, err)
				return nil
			}
			closed = err
		}
	}
	var err error
	for attempt := 1; ; attempt++ {
		for _, it := range items {
			it.res, it.err, it.st = StartResult{}, nil, startedRow{}
		}
		g.skip = nil
		if ruler == nil && c.opts.Admitter != nil {
			err = c.writeAsked(ctx, g)
		} else {
			var r *tenantcap.Rule
			if ruler != nil && closed == nil {
				r = &rule
			}
			err = c.write(ctx, g, r, closed != nil)
		}
		if err == nil || !dberr.Conflict(err) || attempt == maxTxAttempts {
			break
		}
	}
	if err != nil {
		c.fail(items, err)
		return nil
	}

	var (
		committed []Committed
		refused   []tenantcap.Decision
		short     []*pending // refused for want of capacity
		admitted  int
	)
	for _, it := range g.sent {
		st := &it.st
		switch st.Outcome {
		case outcomeNew:
			it.res = st.result(it, c.shard)
			committed = append(committed, Committed{Params: it.p, Result: it.res})
			admitted++
		case outcomeMoved:
			it.err = &MovedError{Tenant: it.p.Tenant, To: int(st.MovedTo)}
		case outcomeSkipped:
			// it.err holds the hook's refusal.
		case outcomeRefused:
			if closed != nil {
				it.err = closed
				refused = append(refused, tenantcap.Decision{Reason: tenantcap.ReasonUnavailable, Tenant: it.p.Tenant})
				continue
			}
			d := st.decision(rule, it.p.Tenant)
			it.err = d.Err()
			refused = append(refused, d)
		case outcomeLease:
			short = append(short, it)
		case outcomeError:
			it.err = &pgconn.PgError{Severity: "ERROR", Code: st.ErrCode, Message: st.ErrMessage,
				ConstraintName: st.ErrConstraint}
		case outcomeExisting:
			// Answered below from the stored run.
		default:
			it.err = fmt.Errorf("runstore: start group: outcome %q for %s/%s", st.Outcome, it.p.Tenant, it.p.Req.ID)
		}
	}
	var again []*pending
	if len(short) > 0 {
		again, refused = c.takeCapacity(ctx, ruler, rule, short, last, refused)
	}
	if ruler != nil && (admitted > 0 || len(refused) > 0) {
		ruler.Decided(admitted, refused)
	}
	sendAgain := make(map[*pending]bool, len(again))
	for _, it := range again {
		sendAgain[it] = true
	}
	c.replay(ctx, items, sendAgain)
	var next []*pending
	for _, it := range items {
		if sendAgain[it.rep] {
			next = append(next, it)
			continue
		}
		close(it.done)
	}
	if len(committed) > 0 && c.opts.AfterCommit != nil {
		c.opts.AfterCommit(committed)
	}
	return next
}

// fail answers every start with err.
func (c *Committer) fail(items []*pending, err error) {
	for _, it := range items {
		it.res, it.err = StartResult{}, err
		close(it.done)
	}
}

// replay answers the starts that name an existing run: a start whose id
// the statement found stored, and a second start of an id in the group
// whose first is stored now. A replay gets the stored run, or ErrConflict
// when the request differs. A second start of an id whose first was
// refused gets the same answer; one whose first is sent again goes again
// with it (skip).
func (c *Committer) replay(ctx context.Context, items []*pending, skip map[*pending]bool) {
	var ask []*pending
	for _, it := range items {
		rep := it.rep
		switch {
		case skip[rep]:
		case rep.st.Outcome == outcomeExisting || (rep != it && rep.st.Outcome == outcomeNew):
			ask = append(ask, it)
		case rep != it:
			it.res, it.err = rep.res, rep.err
		}
	}
	if len(ask) == 0 {
		return
	}
	ps := make([]StartParams, len(ask))
	for i, it := range ask {
		ps[i] = it.p
		ps[i].Shard = c.shard
	}
	out, found, err := Existing(ctx, c.db, ps)
	for i, it := range ask {
		switch {
		case err != nil:
			it.res, it.err = StartResult{}, err
		case !found[i]:
			it.res, it.err = StartResult{}, fmt.Errorf("runstore: start %s/%s: the run of this id is gone", it.p.Tenant, it.p.Req.ID)
		default:
			it.res, it.err = out[i].Result, out[i].Err
		}
	}
}

// takeCapacity deals with the starts the statement refused for want of the
// shard's capacity lease: it takes enough capacity for all of them (a
// round trip to shard 0, under no lock of the shard) and returns them to
// be sent again, with refused extended by those it answers instead: the
// ones the ledger could not make room for, or all of them on the last
// round, each refused with what the shard's lease then gives.
func (c *Committer) takeCapacity(ctx context.Context, ruler tenantcap.Ruler, rule tenantcap.Rule, short []*pending, last bool,
	refused []tenantcap.Decision) ([]*pending, []tenantcap.Decision) {
	// The capacity the starts need were they all admitted, one after the
	// other as the statement judged them.
	need, lease := 0, 0
	before := map[string]int{}
	for i, it := range short {
		st := &it.st
		lease = int(st.Lease)
		n := rule.LeaseNeeded(int(st.Shard)+i, int(st.Own)+before[it.p.Tenant])
		need = max(need, n)
		before[it.p.Tenant]++
	}
	got := lease
	if !last && need > lease {
		var err error
		// The statement's count: starts of other groups admitted since
		// then took capacity this need does not count (Leases.Acquire).
		seen := int(short[0].st.Shard)
		if got, err = ruler.Acquire(ctx, c.shard, seen, need); err != nil {
			for _, it := range short {
				it.err = err
			}
			return nil, refused
		}
	}
	if !last && got > lease {
		return short, refused
	}
	for _, it := range short {
		st := &it.st
		d, _ := rule.Judge(it.p.Tenant, int(st.Shard), int(st.Own), max(got, lease), int(st.Scheduled))
		if d.Admit {
			// More capacity would admit it, but there is none to be had
			// now: the refusal the lease gave.
			d, _ = rule.Judge(it.p.Tenant, int(st.Shard), int(st.Own), lease, int(st.Scheduled))
		}
		if d.Admit {
			d.Admit, d.Reason, d.RetryAfter = false, tenantcap.ReasonSystem, rule.RetryAfter
		}
		it.err = d.Err()
		refused = append(refused, d)
	}
	return nil, refused
}

// write sends the group in one round trip: the statement in a transaction
// that commits without waiting for its flush (the statement turns
// synchronous_commit off), then the wait for the flush (see Committer).
// rule is nil to admit every start; closed refuses every new run.
func (c *Committer) write(ctx context.Context, g *group, rule *tenantcap.Rule, closed bool) (err error) {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("runstore: acquire connection: %w", err)
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlRunStartGroup, groupArgs(g, rule, closed)...)
	b.Queue("COMMIT")
	b.Queue(sqlRunStartFlush)
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("runstore: start group: %w", cerr)
		}
		if err != nil {
			rollback(conn.Conn())
		}
	}()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("runstore: begin: %w", err)
	}
	if err := readStarted(br, g); err != nil {
		return err
	}
	return c.commit(br, g)
}

// commit reads the end of a group's round trip: the commit, then the
// wait for its flush.
func (c *Committer) commit(br pgx.BatchResults, g *group) error {
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("runstore: commit starts: %w", err)
	}
	if tag.String() != "COMMIT" {
		return errors.New("runstore: commit starts: the transaction was rolled back")
	}
	if g.committed != nil {
		g.committed()
	}
	if c.committed != nil {
		c.committed()
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("runstore: wait for the starts to be durable: %w", err)
	}
	return nil
}

// rollback ends a transaction a failed round trip may have left open. A
// connection given back inside a transaction is closed by the pool, so a
// failed rollback leaves nothing behind.
func rollback(conn *pgx.Conn) {
	if conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, "ROLLBACK")
}

// writeAsked writes the group for a hook that is not a Ruler: the
// group is written with every start admitted, the Hook is asked about each
// new run with the counts it was written with, and, when it refused some,
// the group is written again without them (under a savepoint, the count
// rows locked before it) until it refuses none. Then the transaction
// commits as in write.
func (c *Committer) writeAsked(ctx context.Context, g *group) (err error) {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("runstore: acquire connection: %w", err)
	}
	defer conn.Release()
	defer func() {
		if err != nil {
			rollback(conn.Conn())
		}
	}()
	first := true
	for {
		b := &pgx.Batch{}
		if first {
			b.Queue("BEGIN")
			b.Queue(sqlTenantRunningLock, g.tenants)
			b.Queue("SAVEPOINT harvest_group")
		} else {
			b.Queue("ROLLBACK TO SAVEPOINT harvest_group")
		}
		b.Queue(sqlRunStartGroup, groupArgs(g, nil, false)...)
		br := conn.SendBatch(ctx, b)
		n := 1
		if first {
			n = 3
		}
		for range n {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return fmt.Errorf("runstore: start group: %w", err)
			}
		}
		err := readStarted(br, g)
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("runstore: start group: %w", cerr)
		}
		if err != nil {
			return err
		}
		first = false
		refused, err := c.ask(ctx, g)
		if err != nil {
			return err
		}
		if refused == 0 {
			break
		}
	}
	b := &pgx.Batch{}
	b.Queue("COMMIT")
	b.Queue(sqlRunStartFlush)
	br := conn.SendBatch(ctx, b)
	err = c.commit(br, g)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("runstore: start group: %w", cerr)
	}
	return err
}

// ask puts the new runs of a written group to the admission hook, in the order
// they were written. A refused start is marked with its error and to be
// skipped; the starts after it are judged by the counts they will have
// once it is left out, as if the starts had run one after the other. It
// returns how many it refused.
func (c *Committer) ask(ctx context.Context, g *group) (int, error) {
	refused := 0
	byTenant, scheduledByTenant := map[string]int{}, map[string]int{}
	for i, it := range g.sent {
		st := &it.st
		if st.Outcome != outcomeNew {
			continue
		}
		a := tenantcap.Admission{
			Shard: c.shard, Tenant: it.p.Tenant, Req: &it.p.Req,
			Running:      int(st.Own) + 1 - byTenant[it.p.Tenant],
			ShardRunning: int(st.Shard) + 1 - refused,
			ShardLease:   int(st.Lease),
		}
		if st.Scheduled > 0 {
			a.Scheduled = int(st.Scheduled) - scheduledByTenant[it.p.Tenant]
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
		if st.Scheduled > 0 {
			scheduledByTenant[it.p.Tenant]++
		}
		if g.skip == nil {
			g.skip = make([]bool, len(g.sent))
		}
		g.skip[i] = true
		st.Outcome = outcomeSkipped
		it.err = err
		byTenant[it.p.Tenant]++
		refused++
	}
	return refused, nil
}

// groupArgs are the parameters of RunStartGroup.
func groupArgs(g *group, rule *tenantcap.Rule, closed bool) []any {
	args := manyArgs(g.sent)
	args = append(args, g.skip)
	if rule == nil {
		args = append(args, nil, nil, nil, nil, nil, nil, nil, closed)
	} else {
		p := rule.Params()
		args = append(args, p.Algorithm, p.TFM, p.MaxRuns, p.StaticLimit, p.Others, p.Leased, p.ScheduledCap, closed)
	}
	notify := make([]bool, len(g.sent))
	for i, it := range g.sent {
		notify[i] = it.row.notify
	}
	return append(args, notify)
}

// readStarted reads the rows of RunStartGroup into the group's starts.
func readStarted(br pgx.BatchResults, g *group) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("runstore: start group: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[startedRow])
	if err != nil {
		return fmt.Errorf("runstore: start group: %w", err)
	}
	for _, r := range got {
		if r.Ord < 1 || int(r.Ord) > len(g.sent) {
			return fmt.Errorf("runstore: start group: a row for start %d of %d", r.Ord, len(g.sent))
		}
		it := g.sent[r.Ord-1]
		if r.Outcome == outcomeSkipped && it.st.Outcome == outcomeSkipped {
			// Refused by the hook on an earlier writing: keep its error.
			continue
		}
		it.st = r
	}
	return nil
}

// isAPIError reports an *api.Error: a decision to hand the caller, as
// opposed to a failure.
func isAPIError(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}
