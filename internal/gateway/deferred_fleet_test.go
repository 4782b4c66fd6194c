package gateway

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/worker"
)

// Every worker runs a janitor, and gateways fire filled batches: racing
// janitors (here six, ticking as fast as they can) fire exactly one run per
// throttled start, per debounce window and per batch, and keep the
// throttle's limit.
func TestDeferredRacingJanitorsFireEachOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const (
		throttled = 12
		limit     = 3
		period    = 300 * time.Millisecond
		windows   = 8
		batches   = 8
	)
	c := b.client(t, secretA)
	nc := b.natsClient(t, tenantOn[0])
	atOnce := 0 // starts answered with their run started
	start := func(cl *client.Client, id string, o client.StartOptions) {
		o.ID = id
		st, err := cl.Start(b.ctx, "echo", "race", map[string]string{"id": id}, o)
		require.NoError(t, err, id)
		if !st.Deferred() {
			atOnce++
		}
	}
	for i := range throttled {
		start(c, fmt.Sprint("t", i), client.StartOptions{Throttle: client.Throttle("t", limit, period)})
	}
	for i := range windows {
		for j := range 2 {
			start(nc, fmt.Sprint("w", i, "-", j), client.StartOptions{Debounce: client.Debounce(fmt.Sprint("w", i), 100*time.Millisecond, 0)})
		}
	}
	for i := range batches {
		for j := range 2 {
			start(c, fmt.Sprint("b", i, "-", j), client.StartOptions{Batch: client.Batch(fmt.Sprint("b", i), 5, 100*time.Millisecond)})
		}
	}
	want := throttled + windows + batches
	require.GreaterOrEqual(t, atOnce, limit, "the throttle's first starts start at once")

	// The janitors stop between ticks once nothing is pending, so every
	// tick runs to its end: one cut short could commit a firing and lose
	// the acknowledgement of its commit, and so the count in its report.
	deadline := time.Now().Add(15 * time.Second)
	var done atomic.Bool
	var fired atomic.Int64
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for !done.Load() && time.Now().Before(deadline) {
				rep, err := janitor.Tick(b.ctx, b.dbs[0], janitor.DefaultSettings())
				require.NoError(t, err)
				fired.Add(int64(rep.DeferredFired))
				require.Len(t, rep.DeferredStarted, rep.DeferredFired)
				if b.count(t, 0, `SELECT count(*) FROM deferred_groups WHERE state = 'pending'`) == 0 {
					done.Store(true)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM deferred_groups WHERE state = 'pending'`), "everything fired in time")
	require.Equal(t, int64(want-atOnce), fired.Load())
	require.Equal(t, want, b.count(t, 0, `SELECT count(*) FROM runs WHERE status = 'queued'`))
	require.Equal(t, want, b.count(t, 0, `SELECT count(*) FROM tasks`))
	// (Throttle groups whose run left the key's window are pruned by the
	// janitors as they go, so the groups are not counted.)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM deferred_groups WHERE state <> 'fired'`))
	require.Equal(t, want, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	for i := range throttled {
		require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs WHERE id = $1 AND status = 'queued'`, fmt.Sprint("t", i)))
	}
	for i := range batches {
		m0, m1 := b.getRun(t, secretA, fmt.Sprint("b", i, "-0")), b.getRun(t, secretA, fmt.Sprint("b", i, "-1"))
		require.Equal(t, m0.RunID, m1.RunID)
		require.Equal(t, api.StatusQueued, m1.Status)
	}
	// The throttle's spacing is checked with a controlled clock in
	// internal/deferred (TestThrottle*); measured here on created_at it
	// would be a wall-clock assertion that a loaded machine breaks. This
	// test is about firing each start exactly once.
	require.Equal(t, throttled, b.count(t, 0, `SELECT count(*) FROM runs WHERE id LIKE 't%'`))
}

// A run fired by a worker's janitor is announced: the worker (polling
// only once a minute) runs it as soon as it fires.
func TestDeferredFiredByAJanitorWakesTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	wnc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	t.Cleanup(wnc.Close)
	cfg := worker.DefaultConfig()
	cfg.Shard = 0
	cfg.Queues = map[string]float64{"wq": 1}
	cfg.MaxConcurrentClaims = 1
	cfg.PollInterval = time.Minute
	cfg.JanitorInterval = 50 * time.Millisecond
	done := make(chan string, 4)
	w, err := worker.New(b.dbs[0], cfg, worker.Options{NATS: wnc, Logger: discardLogger()})
	require.NoError(t, err)
	w.HandleFunc("echo", func(_ context.Context, task worker.Task) (worker.Result, error) {
		done <- task.RunID
		return worker.Result{}, nil
	})
	ctx, stop := context.WithCancel(b.ctx)
	ended := make(chan error, 1)
	go func() { ended <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ended })
	<-w.Ready()
	time.Sleep(100 * time.Millisecond) // the claim loop has looked once and waits

	st, err := b.client(t, secretA).Start(b.ctx, "echo", "wq", nil, client.StartOptions{
		ID: "late", Debounce: client.Debounce("", 200*time.Millisecond, 0)})
	require.NoError(t, err)
	require.True(t, st.Deferred())
	select {
	case id := <-done:
		require.Equal(t, st.Run.RunID, id)
	case <-time.After(10 * time.Second):
		t.Fatal("the fired run was not announced to the worker")
	}
	run, err := b.client(t, secretA).Wait(b.ctx, "late", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.Equal(t, "late", run.ID)
	require.Equal(t, st.Run.RunID, run.RunID)
}

// The typed client sets the three modes over HTTP and NATS and reads the
// new fields of the answer.
func TestClientDeferredOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for i, c := range []*client.Client{b.client(t, secretA), b.natsClient(t, tenantOn[0])} {
		p := fmt.Sprint("c", i, "-")
		tr := client.StartOptions{QuotaKey: "acct", Throttle: client.Throttle(p, 1, time.Hour)}
		tr.ID = p + "t1"
		st, err := c.Start(b.ctx, "echo", "cl", nil, tr)
		require.NoError(t, err)
		require.True(t, st.Created)
		require.False(t, st.Deferred())
		require.Equal(t, api.ModeThrottle, st.Run.DeferMode)
		require.Equal(t, "acct", st.Run.FairnessKey)
		tr.ID = p + "t2"
		st, err = c.Start(b.ctx, "echo", "cl", nil, tr)
		require.NoError(t, err)
		require.True(t, st.Deferred())
		require.NotNil(t, st.Run.FiresAt)
		st, err = c.Start(b.ctx, "echo", "cl", nil, tr)
		require.NoError(t, err)
		require.False(t, st.Created, "a replay")

		st, err = c.Start(b.ctx, "echo", "cl", map[string]int{"n": 1}, client.StartOptions{ID: p + "d1",
			Debounce: client.Debounce(p, time.Hour, 2*time.Hour)})
		require.NoError(t, err)
		require.True(t, st.Deferred())
		require.Equal(t, api.ModeDebounce, st.Run.DeferMode)
		got, err := b.client(t, secretA).Get(b.ctx, p+"d1")
		require.NoError(t, err)
		require.Equal(t, st.Run.RunID, got.RunID)
		require.Equal(t, api.StatusDeferred, got.Status)
		require.Equal(t, st.Run.FiresAt.Time, got.FiresAt.Time)

		bo := client.StartOptions{Batch: client.Batch(p, 2, time.Hour)}
		bo.ID = p + "b1"
		first, err := c.Start(b.ctx, "echo", "cl", 1, bo)
		require.NoError(t, err)
		bo.ID = p + "b2"
		second, err := c.Start(b.ctx, "echo", "cl", 2, bo)
		require.NoError(t, err)
		require.True(t, first.Deferred())
		require.False(t, second.Deferred())
		require.Equal(t, first.Run.RunID, second.Run.RunID)

		_, err = c.Start(b.ctx, "echo", "cl", nil, client.StartOptions{FairnessKey: "f", Debounce: client.Debounce("", time.Second, 0)})
		var ae *api.Error
		require.ErrorAs(t, err, &ae)
		require.Equal(t, 400, ae.Status)
		require.Equal(t, "fairness_key", ae.Field)
	}
}
