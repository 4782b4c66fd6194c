package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// bundle is what most tests need: a context bounding the test, a fresh
// shard database, a NATS server and a connection to it.
type bundle struct {
	t   testing.TB
	ctx context.Context
	db  *pgxpool.Pool
	nc  *nats.Conn
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	b := &bundle{t: t, ctx: ctx, db: testsvc.NewDB(t)}
	nc, err := nats.Connect(testsvc.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	b.nc = nc
	return b
}

// startOpts describes a run started through the shard store's start
// function, as the gateway starts runs.
type startOpts struct {
	Tenant      string // default "acme"
	Name        string // default "echo"
	Queue       string // default "q"
	Input       string // JSON; default {}
	Key         string // fairness key; default none
	Priority    int
	MaxAttempts int // default: the API default
	Timeout     time.Duration
	Notify      bool // announce the run's end on NATS
}

var runSeq struct {
	sync.Mutex
	n int
}

func (b *bundle) start(o startOpts) runstore.StartResult {
	b.t.Helper()
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	if o.Name == "" {
		o.Name = "echo"
	}
	if o.Queue == "" {
		o.Queue = "q"
	}
	if o.Input == "" {
		o.Input = "{}"
	}
	runSeq.Lock()
	runSeq.n++
	id := fmt.Sprintf("run-%d", runSeq.n)
	runSeq.Unlock()
	req := api.StartRequest{ID: id, Name: o.Name, Queue: o.Queue, Input: json.RawMessage(o.Input)}
	if o.Key != "" {
		req.FairnessKey = &o.Key
	}
	req.Priority, req.Notify = o.Priority, o.Notify
	if o.MaxAttempts > 0 {
		req.MaxAttempts = &o.MaxAttempts
	}
	if o.Timeout > 0 {
		d := api.Duration(o.Timeout)
		req.Timeout = &d
	}
	require.Nil(b.t, req.Validate())
	res, err := runstore.Start(b.ctx, b.db, runstore.StartParams{Tenant: o.Tenant, Shard: 0, Req: req})
	require.NoError(b.t, err)
	return res
}

// wake publishes a wake-up for a queue of shard 0, as a gateway does
// after a start.
func (b *bundle) wake(queue string) {
	b.t.Helper()
	require.NoError(b.t, dispatch.Publish(b.ctx, b.nc, dispatch.Subjects{}.Wake(0, queue), dispatch.Wake{Tasks: 1}))
}

func (b *bundle) run(tenant, id string) api.Run {
	b.t.Helper()
	r, err := runstore.Get(b.ctx, b.db, tenant, id, 0)
	require.NoError(b.t, err)
	return r
}

// finish is one attempt's recorded outcome, seen through the Finished hook.
type finish struct {
	Task    worker.Task
	Outcome worker.Outcome
	Err     error
}

// workerOpts configures a test worker. Zero values are the test defaults:
// queue "q", one claim loop, a one-hour poll (so only wake-ups, dispatches
// and the loops' own re-claims find work), no janitor, millisecond retries.
type workerOpts struct {
	Config   func(*worker.Config)
	Handlers map[string]worker.HandlerFunc
	NoNATS   bool
	NC       *nats.Conn
	Hooks    worker.Hooks
	// DB is the worker's pool (default: the bundle's).
	DB *pgxpool.Pool
}

// running is a started test worker.
type running struct {
	W        *worker.Worker
	Finished chan finish // every outcome, buffered
	Idle     chan struct{}
	stop     context.CancelFunc
	done     chan error
}

func testConfig() worker.Config {
	cfg := worker.DefaultConfig()
	cfg.Queues = map[string]float64{"q": 1}
	// Most tests follow one task through the single-claim loop; batch mode
	// (the default) has its own tests (batch_test.go) and runs in the
	// guarantee tests at the defaults (weights_live_test.go).
	cfg.MaxConcurrentClaims = 1
	cfg.ClaimBatch = 1
	cfg.PollInterval = time.Hour
	cfg.RunJanitor = false
	cfg.RetryBase = time.Millisecond
	cfg.RetryMax = 5 * time.Millisecond
	cfg.ShutdownGrace = 10 * time.Second
	cfg.ID = "w1"
	return cfg
}

func (b *bundle) worker(o workerOpts) *running {
	b.t.Helper()
	cfg := testConfig()
	if o.Config != nil {
		o.Config(&cfg)
	}
	r := &running{Finished: make(chan finish, 100000), Idle: make(chan struct{}, 100000), done: make(chan error, 1)}
	hooks := o.Hooks
	hooks.Finished = func(t worker.Task, out worker.Outcome, err error) {
		if o.Hooks.Finished != nil {
			o.Hooks.Finished(t, out, err)
		}
		r.Finished <- finish{t, out, err}
	}
	hooks.Idle = func() { r.Idle <- struct{}{} }
	opts := worker.Options{Hooks: hooks, Logger: slog.New(slog.NewTextHandler(b.t.Output(), nil))}
	if !o.NoNATS {
		opts.NATS = b.nc
		if o.NC != nil {
			opts.NATS = o.NC
		}
	}
	db := b.db
	if o.DB != nil {
		db = o.DB
	}
	w, err := worker.New(db, cfg, opts)
	require.NoError(b.t, err)
	for name, h := range o.Handlers {
		w.Handle(name, h)
	}
	if _, ok := o.Handlers["echo"]; !ok {
		w.HandleFunc("echo", func(_ context.Context, t worker.Task) (worker.Result, error) {
			return worker.Complete(t.Input), nil
		})
	}
	r.W = w
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- w.Run(ctx) }()
	b.t.Cleanup(func() { r.Stop(b.t) })
	select {
	case <-w.Ready():
	case <-b.ctx.Done():
		b.t.Fatal("worker not ready")
	}
	return r
}

// Stop stops the worker and waits for Run to return (idempotent).
func (r *running) Stop(t testing.TB) {
	t.Helper()
	r.stop()
	if r.done == nil {
		return
	}
	select {
	case err := <-r.done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("worker did not stop")
	}
	r.done = nil
}

// next waits for the next recorded outcome.
func (r *running) next(t testing.TB, ctx context.Context) finish {
	t.Helper()
	select {
	case f := <-r.Finished:
		return f
	case <-ctx.Done():
		t.Fatal("no task finished before the test's deadline")
		return finish{}
	}
}

// waitIdle waits until n claim loops have reported an empty claim.
func (r *running) waitIdle(t testing.TB, ctx context.Context, n int) {
	t.Helper()
	for range n {
		select {
		case <-r.Idle:
		case <-ctx.Done():
			t.Fatal("claim loops never went idle")
		}
	}
}
