package worker

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/sourcegraph/conc"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/dispatch"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlQueueBacklog    = sqlfile.Must(sqlFiles, "QueueBacklog")
	sqlQueueDepth      = sqlfile.Must(sqlFiles, "QueueDepth")
	sqlShardUnfinished = sqlfile.Must(sqlFiles, "ShardUnfinished")
	dispatchQueueGroup = "harvest-workers"
)

// dbTimeout bounds one statement of the worker's own bookkeeping (claims,
// reports, heartbeats), which must not be cut short by a stop signal.
const dbTimeout = 30 * time.Second

// abandonAfter is how long a stopping worker waits, after the grace period
// has cancelled the handlers' contexts, for handlers that ignore their
// context. Their tasks are then handed back anyway.
const abandonAfter = 5 * time.Second

// Outcome says how a task attempt ended, as far as the worker recorded it.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeCompleted Outcome = "completed" // the run completed
	OutcomeContinued Outcome = "continued" // the run's next task was enqueued
	OutcomeRetried   Outcome = "retried"   // the attempt failed and will run again
	OutcomeFailed    Outcome = "failed"    // the attempt failed and so did the run
	OutcomeDiscarded Outcome = "discarded" // lease lost or run cancelled: nothing recorded
	OutcomeReleased  Outcome = "released"  // handed back at shutdown, attempt not counted
	OutcomeError     Outcome = "error"     // the outcome could not be recorded (the lease will expire)
)

// Hooks let tests watch a worker without sleeping. Each may be nil; they
// run on the worker's goroutines and must not block for long.
type Hooks struct {
	// Claiming runs when a claim loop is about to send a claim statement,
	// after it checked that the worker is not stopping: a test may hold it
	// to keep a claim under way while the worker begins to stop.
	Claiming func()
	// Claimed runs after a task is claimed, before its handler starts.
	Claimed func(Task)
	// Idle runs when a claim loop found nothing and is about to wait.
	Idle func()
	// Finished runs after an attempt's outcome was recorded.
	Finished func(Task, Outcome, error)
	// Janitor sees every janitor tick.
	Janitor func(JanitorReport, error)
}

// JanitorReport counts what one janitor tick did.
type JanitorReport struct {
	Requeued       int  // expired leases put back as pending
	FailedRuns     int  // runs failed because an expired lease used their last attempt
	Promoted       int  // scheduled tasks made claimable
	Exclusive      bool // this janitor held the shard's maintenance lock for the jobs below
	Recounted      int  // tenants whose running count was wrong and was fixed
	DeletedRuns    int  // finished runs deleted past the retention period
	DeletedAudit   int  // audit rows deleted past the audit retention
	DeletedBuckets int  // idle rate buckets dropped
	PrunedKeys     int  // idle fairness state rows pruned
	RepairedKeys   int  // keys whose fairness head was wrong and was rebuilt
	// Deferred starts (throttle, debounce, batch): runs fired, groups
	// closed because their waiting run was cancelled, finished groups
	// pruned.
	DeferredFired     int
	DeferredCancelled int
	DeferredPruned    int
	// Tables analyzed because their statistics fell behind their writes
	// (only where the server's autovacuum is off or behind).
	Analyzed int
}

// janitorReport is the janitor's counts as the hook sees them: a type
// conversion, so that a count the janitor adds cannot be left out here.
func janitorReport(r janitor.Report) JanitorReport { return JanitorReport(r.Counts) }

// Options are the worker's collaborators besides its configuration.
type Options struct {
	// NATS, when set, brings wake-ups and dispatches and carries run
	// events. Without it the worker polls only.
	NATS *nats.Conn
	// Subjects names the NATS subjects (default prefix when zero).
	Subjects dispatch.Subjects
	// Logger receives the worker's log lines (default slog.Default()).
	Logger *slog.Logger
	// Fallback runs workflows that have no registered handler. Without
	// one, such a task fails its attempt (and is retried, maybe by a
	// worker that knows the workflow).
	Fallback Handler
	// Hooks are test hooks; leave them nil in production.
	Hooks Hooks
}

// Worker claims tasks of one shard and runs them with the registered
// handlers. Make one with New, register handlers, then call Run.
type Worker struct {
	cfg Config
	db  *pgxpool.Pool
	// claimer sends the claim loops' fair claims of a queue that wait at
	// the same time as one statement: one turn on the queue's fair lock.
	claimer *claim.Claimer
	nc      *nats.Conn
	subj    dispatch.Subjects
	log     *slog.Logger
	hooks   Hooks
	queues  []claim.QueueWeight
	// shallow holds, per queue, whether the last batch claim of the queue
	// came back short: the next one is then sent claim.Request.Shallow
	// (fair batches only).
	// Written by the claim loops; the map itself is fixed at New.
	shallow map[string]*atomic.Bool

	handlers map[string]Handler
	fallback Handler
	started  atomic.Bool

	wake       broadcast
	dispatches chan dispatch.Dispatch
	ready      chan struct{}

	// stopping is closed as the worker begins to stop (the claim loops'
	// context ends), before any task is handed back: run gives back unrun
	// a task claimed after that.
	stopping <-chan struct{}
	// execCtx ends when the shutdown grace is over; abandon closes
	// abandonAfter later.
	execCtx context.Context
	abandon chan struct{}

	inst instruments

	// outcomes records the attempts' outcomes in batches, and beats
	// extends the leases of the tasks running, one statement for all
	// (both modes; they live from Run's start until its claim loops end).
	outcomes *outcomes
	beats    *heartbeats
}

// New checks cfg and makes a worker on db, the pool of the shard cfg.Shard
// (migrated with pkg/migrate).
func New(db *pgxpool.Pool, cfg Config, opts Options) (*Worker, error) {
	if db == nil {
		return nil, errors.New("worker: nil database pool")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = DefaultID()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("worker", cfg.ID, "shard", cfg.Shard)
	if cfg.FairnessKeys && cfg.PriorityAgingSecs > 0 {
		log.Warn("priority ageing and fairness keys are both on: ageing sorts before the fairness lag, " +
			"so the oldest rows of a flood gain priority and can be claimed ahead of a newer key's rows " +
			"until those age too")
	}
	w := &Worker{
		cfg:        cfg,
		db:         db,
		claimer:    claim.NewClaimer(db),
		nc:         opts.NATS,
		subj:       opts.Subjects,
		log:        log,
		hooks:      opts.Hooks,
		handlers:   map[string]Handler{},
		fallback:   opts.Fallback,
		dispatches: make(chan dispatch.Dispatch),
		ready:      make(chan struct{}),
		abandon:    make(chan struct{}),
		inst:       newInstruments(),
	}
	w.shallow = make(map[string]*atomic.Bool, len(cfg.Queues))
	for _, q := range cfg.QueueNames() {
		w.queues = append(w.queues, claim.QueueWeight{Queue: q, Weight: cfg.Queues[q]})
		w.shallow[q] = new(atomic.Bool)
	}
	w.wake.init()
	return w, nil
}

// Handle registers the handler of a workflow name. Register every handler
// before Run; a second handler for one name replaces the first.
func (w *Worker) Handle(workflow string, h Handler) {
	if w.started.Load() {
		panic("worker: Handle called after Run")
	}
	w.handlers[workflow] = h
}

// HandleFunc registers a function as the handler of a workflow name.
func (w *Worker) HandleFunc(workflow string, f func(ctx context.Context, t Task) (Result, error)) {
	w.Handle(workflow, HandlerFunc(f))
}

// ID is the worker's id, as recorded on the tasks it claims.
func (w *Worker) ID() string { return w.cfg.ID }

// Config returns the configuration the worker runs with: New's copy, with
// the ID filled in when it was empty.
func (w *Worker) Config() Config {
	c := w.cfg
	c.Queues = maps.Clone(c.Queues)
	return c
}

// Workflows lists the workflow names with a registered handler, in name
// order (the fallback, if any, runs every other name).
func (w *Worker) Workflows() []string {
	return slices.Sorted(maps.Keys(w.handlers))
}

// Ready is closed once Run has subscribed to its NATS subjects (when the
// server is reachable) and started its claim loops.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Run claims and runs tasks until ctx ends, then stops gracefully: it
// stops claiming, lets running handlers finish for up to the shutdown
// grace, cancels the rest (context.Cause: ErrShutdown) and hands their
// tasks back, so none is left running. A task that a claim under way at
// the stop took is handed back without its handler starting. It returns
// nil after a clean stop. Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: Run called twice")
	}
	var stopExec context.CancelCauseFunc
	w.execCtx, stopExec = context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopExec(nil)
	claimCtx, stopClaims := context.WithCancel(context.WithoutCancel(ctx))
	defer stopClaims()
	w.stopping = claimCtx.Done()

	subs, err := w.subscribe()
	if err != nil {
		return err
	}
	var bg conc.WaitGroup
	// Presence: announced before the worker is ready, renewed by one
	// goroutine that ends with the claims, withdrawn after a clean stop.
	w.announce(ctx)
	bg.Go(func() { w.presence(claimCtx) })
	if w.cfg.RunJanitor {
		bg.Go(func() {
			janitor.Run(claimCtx, w.db, janitor.Settings(w.cfg.Janitor), w.cfg.JanitorInterval, w.log, w.janitorTick)
		})
	}
	w.outcomes, w.beats = newOutcomes(w), newHeartbeats(w)
	var loops conc.WaitGroup
	if w.cfg.ClaimBatch > 1 {
		loops.Go(func() { w.batched(claimCtx) })
	} else {
		for i := range w.cfg.MaxConcurrentClaims {
			loops.Go(func() { w.loop(claimCtx, i) })
		}
	}
	w.log.Info("worker started", "queues", w.cfg.QueueNames(), "fair", w.cfg.FairnessKeys,
		"loops", w.cfg.MaxConcurrentClaims, "nats", w.nc != nil, "workflows", w.Workflows())
	close(w.ready)

	<-ctx.Done()
	w.log.Info("worker stopping: no new claims", "grace", w.cfg.ShutdownGrace)
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	stopClaims()
	done := make(chan struct{})
	go func() {
		loops.Wait()
		close(done)
	}()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		w.log.Warn("shutdown grace over: cancelling running tasks and handing them back")
		stopExec(ErrShutdown)
		select {
		case <-done:
		case <-time.After(abandonAfter):
			w.log.Error("handlers ignore their cancelled context: handing their tasks back without them")
			close(w.abandon)
			<-done
		}
	}
	// Every task has finished and its outcome was queued: record the last
	// ones and stop beating.
	w.beats.close()
	w.outcomes.close()
	bg.Wait()
	w.withdraw(ctx)
	w.log.Info("worker stopped")
	return nil
}

// subscribe listens for wake-ups and dispatches of every queue served.
func (w *Worker) subscribe() ([]*nats.Subscription, error) {
	if w.nc == nil {
		return nil, nil
	}
	var subs []*nats.Subscription
	for _, q := range w.queues {
		queue := q.Queue
		ws, err := w.nc.QueueSubscribe(w.subj.Wake(w.cfg.Shard, q.Queue), wakeQueueGroup, func(m *nats.Msg) {
			w.inst.wakeups.Add(context.Background(), 1)
			w.woken(queue, m)
		})
		if err != nil {
			return nil, fmt.Errorf("worker: subscribe to wake-ups of %q: %w", q.Queue, err)
		}
		subs = append(subs, ws)
		ds, err := w.nc.QueueSubscribe(w.subj.Dispatch(w.cfg.Shard, q.Queue), dispatchQueueGroup, func(m *nats.Msg) {
			var d dispatch.Dispatch
			if err := json.Unmarshal(m.Data, &d); err != nil || d.TaskID <= 0 {
				w.log.Warn("ignoring a malformed dispatch", "subject", m.Subject)
				return
			}
			d.Queue = queue // the subject names the queue; trust it over the body
			select {
			case w.dispatches <- d: // a free claim loop takes it
			default:
				// Every loop is busy (they claim again as soon as they
				// finish): another worker may have a free one.
				w.passWake(queue, 1, 1)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("worker: subscribe to dispatches of %q: %w", q.Queue, err)
		}
		subs = append(subs, ds)
	}
	// Make sure the server has the subscriptions before claiming; when it
	// is unreachable they are sent on reconnect, and polling covers the gap.
	if err := w.nc.FlushTimeout(5 * time.Second); err != nil {
		w.log.Warn("NATS not reachable at start: polling until it is", "err", err)
	}
	return subs, nil
}

// Wake-ups go to one worker of the shard (a NATS queue group), not to
// all: a wake-up for every start group sent every worker into a claim, and
// all but one of those claims found nothing (docs/benchmarks.md, "What a
// wake-up costs"). The worker that gets one hands a claim turn to one of
// its idle loops, which claims in the fair order as a wake-up always did
// (a batch takes the group's tasks; a loop of one task each hands the turn
// on, nudge). It passes the wake-up on to another worker, at most
// maxWakeHops times, when none of its loops is idle, when the wake-up
// names more tasks than its turn takes, or when it names none (a queue
// resumed, say). The poll is the fallback for a wake-up that found no
// free loop at all.
const (
	wakeQueueGroup = "harvest-workers"
	// wakeHopsHeader counts how often a wake-up was passed on.
	wakeHopsHeader = "Harvest-Wake-Hops"
	maxWakeHops    = 3
)

// woken serves a wake-up of queue.
func (w *Worker) woken(queue string, m *nats.Msg) {
	var wk dispatch.Wake
	_ = json.Unmarshal(m.Data, &wk) // a body not understood names no count
	hops, _ := strconv.Atoi(m.Header.Get(wakeHopsHeader))
	if !w.claimTurn(queue) {
		w.passWake(queue, wk.Tasks, hops+1)
		return
	}
	// An idle loop claims. What one turn takes: a batch, or, for loops of
	// one task each, as many as there are loops (nudge).
	turn := w.cfg.ClaimBatch
	if turn <= 1 {
		turn = w.cfg.MaxConcurrentClaims
	}
	if wk.Tasks == 0 || wk.Tasks > turn {
		w.passWake(queue, max(wk.Tasks-turn, 0), hops+1)
	}
}

// claimTurn hands one claim of queue to an idle claim loop and reports
// whether one took it. When no loop waits, a loop claiming now claims
// again once its claim is done (it took the broadcast before it claimed).
func (w *Worker) claimTurn(queue string) bool {
	select {
	case w.dispatches <- dispatch.Dispatch{Queue: queue}:
		return true
	default:
		w.wake.fire()
		return false
	}
}

// passWake passes a wake-up for tasks of queue (0: a number not known) on
// to another worker of the shard, unless it was passed on maxWakeHops
// times already.
func (w *Worker) passWake(queue string, tasks, hops int) {
	if hops > maxWakeHops {
		return
	}
	msg, err := dispatch.NewMsg(context.Background(), w.subj.Wake(w.cfg.Shard, queue), dispatch.Wake{Tasks: tasks})
	if err == nil {
		msg.Header.Set(wakeHopsHeader, strconv.Itoa(hops))
		err = w.nc.PublishMsg(msg)
	}
	if err != nil {
		w.log.Warn("pass a wake-up on", "queue", queue, "err", err)
	}
}

// broadcast wakes every waiting claim loop at once. A loop takes the
// channel before it claims, so a wake-up that arrives while it claims is
// not lost: the channel is already closed when it starts to wait.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) init() { b.ch = make(chan struct{}) }

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// loop is one claim loop: claim, run, repeat; wait for a wake-up, a
// dispatch or the poll timer when there is nothing to claim.
func (w *Worker) loop(ctx context.Context, n int) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(n)))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		woken := w.wake.wait()
		if c, ok := w.claim(ctx, rng, 0, ""); ok {
			w.nudge()
			w.run(c)
			continue
		}
		if w.hooks.Idle != nil {
			w.hooks.Idle()
		}
		// Poll with up to 20% jitter, so idle workers spread their polls.
		d := w.cfg.PollInterval
		d += time.Duration(rng.Int64N(int64(d)/5 + 1))
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-woken:
		case <-timer.C:
		case d := <-w.dispatches:
			if c, ok := w.claimDispatched(ctx, rng, d); ok {
				w.nudge()
				w.run(c)
			}
		}
		timer.Stop()
	}
}

// nudge has one more idle claim loop claim, after a loop of one task each
// took one: a dispatch names one task of the start group it announces, and
// more may wait. Each loop that finds work passes the turn on, so the
// group's tasks are taken by as many loops as they need, one after the
// other, and the first loop to find nothing ends it.
func (w *Worker) nudge() {
	select {
	case w.dispatches <- dispatch.Dispatch{}:
	default: // no loop is idle
	}
}

// claimDispatched serves a dispatch: the named row by id when it is the
// queue's only due work, otherwise an ordinary fair claim, so that a
// dispatch never lets a key in debt jump ahead of a key without debt.
func (w *Worker) claimDispatched(ctx context.Context, rng *rand.Rand, d dispatch.Dispatch) (*claimed, bool) {
	if d.TaskID <= 0 {
		return w.claim(ctx, rng, 0, "") // a nudge: an ordinary claim
	}
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	var backlog bool
	if err := w.db.QueryRow(dbctx, sqlQueueBacklog, d.Queue, d.TaskID).Scan(&backlog); err != nil {
		w.log.Warn("dispatch: backlog check failed; claiming fairly", "err", err)
		backlog = true
	}
	if backlog {
		return w.claim(ctx, rng, 0, "")
	}
	return w.claim(ctx, rng, d.TaskID, d.Queue)
}
