package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

func TestWakeUpClaimsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan worker.Task, 1)
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"echo": func(_ context.Context, tk worker.Task) (worker.Result, error) {
			got <- tk
			return worker.Complete(tk.Input), nil
		},
	}})
	r.waitIdle(t, b.ctx, 1)
	events, err := b.nc.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())

	// The poll interval is an hour: only the wake-up can bring the claim
	// before the test's deadline.
	st := b.start(startOpts{Input: `{"hello":"world"}`, Key: "k1", Notify: true})
	b.wake("q")

	f := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeCompleted, f.Outcome)
	tk := <-got
	require.Equal(t, st.Run.ID, tk.RunID)
	require.Equal(t, "acme", tk.Tenant)
	require.Equal(t, "echo", tk.Workflow)
	require.Equal(t, "q", tk.Queue)
	require.Equal(t, "k1", tk.Key)
	require.Equal(t, 1, tk.Attempt)
	require.Equal(t, api.DefaultMaxAttempts, tk.MaxAttempts)
	require.JSONEq(t, `{"hello":"world"}`, string(tk.Input))

	run := b.run("acme", st.Run.ID)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `{"hello":"world"}`, string(run.Output))

	// The final run is announced after the commit.
	msg, err := events.NextMsg(time.Minute)
	require.NoError(t, err)
	require.Equal(t, dispatch.Subjects{}.Runs("acme", st.Run.ID), msg.Subject)
	var ev api.Run
	require.NoError(t, json.Unmarshal(msg.Data, &ev))
	require.Equal(t, api.StatusCompleted, ev.Status)
	require.Equal(t, st.Run.ID, ev.ID)

	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 'acme'`).Scan(&running))
	require.Zero(t, running)
}

// A run is announced only when its start asked for it. The two runs end
// one after the other on one worker, whose connection delivers its
// messages in the order it sent them: had the first run been announced,
// its event would come before the second's.
func TestOnlyRunsThatAskAreAnnounced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.worker(workerOpts{})
	r.waitIdle(t, b.ctx, 1)
	events, err := b.nc.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())

	quiet := b.start(startOpts{})
	b.wake("q")
	f := r.next(t, b.ctx)
	require.Equal(t, quiet.Run.ID, f.Task.RunID)
	require.Equal(t, worker.OutcomeCompleted, f.Outcome)
	require.Equal(t, api.StatusCompleted, b.run("acme", quiet.Run.ID).Status)

	told := b.start(startOpts{Notify: true})
	b.wake("q")
	f = r.next(t, b.ctx)
	require.Equal(t, told.Run.ID, f.Task.RunID)
	msg, err := events.NextMsg(time.Minute)
	require.NoError(t, err)
	require.Equal(t, dispatch.Subjects{}.Runs("acme", told.Run.ID), msg.Subject,
		"the first event is the run that asked for it")
}

func TestPollsWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := natsembed.Start(natsembed.Options{})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
		nats.ReconnectWait(10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	r := b.worker(workerOpts{NC: nc, Config: func(c *worker.Config) { c.PollInterval = 20 * time.Millisecond }})
	srv.Shutdown()

	st := b.start(startOpts{})
	f := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeCompleted, f.Outcome)
	require.Equal(t, st.Run.ID, f.Task.RunID)
	require.False(t, nc.IsConnected())
}

func TestRetriesThenFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) { c.PollInterval = 5 * time.Millisecond },
		Handlers: map[string]worker.HandlerFunc{
			"flaky": func(_ context.Context, tk worker.Task) (worker.Result, error) {
				if tk.Attempt < 2 {
					return worker.Result{}, errors.New("not yet")
				}
				return worker.Complete(json.RawMessage(`"ok"`)), nil
			},
			"broken": func(context.Context, worker.Task) (worker.Result, error) {
				return worker.Result{}, errors.New("always broken")
			},
		},
	})
	flaky := b.start(startOpts{Name: "flaky"})
	broken := b.start(startOpts{Name: "broken", MaxAttempts: 3})

	outcomes := map[string][]worker.Outcome{}
	for len(outcomes[flaky.Run.ID]) < 2 || len(outcomes[broken.Run.ID]) < 3 {
		f := r.next(t, b.ctx)
		outcomes[f.Task.RunID] = append(outcomes[f.Task.RunID], f.Outcome)
	}
	require.Equal(t, []worker.Outcome{worker.OutcomeRetried, worker.OutcomeCompleted}, outcomes[flaky.Run.ID])
	require.Equal(t, []worker.Outcome{worker.OutcomeRetried, worker.OutcomeRetried, worker.OutcomeFailed}, outcomes[broken.Run.ID])

	run := b.run("acme", broken.Run.ID)
	require.Equal(t, api.StatusFailed, run.Status)
	require.Equal(t, 3, run.Attempts)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "always broken")
	require.Equal(t, api.StatusCompleted, b.run("acme", flaky.Run.ID).Status)
}

func TestPanicAndPermanentErrorFailTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"panics": func(context.Context, worker.Task) (worker.Result, error) { panic("boom") },
		"permanent": func(context.Context, worker.Task) (worker.Result, error) {
			return worker.Result{}, worker.Permanent(errors.New("bad input"))
		},
	}})
	p := b.start(startOpts{Name: "panics", MaxAttempts: 1})
	b.wake("q")
	require.Equal(t, worker.OutcomeFailed, r.next(t, b.ctx).Outcome)
	perm := b.start(startOpts{Name: "permanent", MaxAttempts: 5})
	b.wake("q")
	require.Equal(t, worker.OutcomeFailed, r.next(t, b.ctx).Outcome)

	run := b.run("acme", p.Run.ID)
	require.Equal(t, api.StatusFailed, run.Status)
	require.Contains(t, *run.Error, "handler panicked: boom")
	run = b.run("acme", perm.Run.ID)
	require.Equal(t, api.StatusFailed, run.Status)
	require.Equal(t, 1, run.Attempts, "a permanent error is not retried")
}

func TestUnknownWorkflowFailsItsAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.worker(workerOpts{})
	st := b.start(startOpts{Name: "nobody-knows", MaxAttempts: 1})
	b.wake("q")
	require.Equal(t, worker.OutcomeFailed, r.next(t, b.ctx).Outcome)
	require.Contains(t, *b.run("acme", st.Run.ID).Error, `no handler for workflow "nobody-knows"`)
}

func TestContinuationsStickToTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"steps": func(_ context.Context, tk worker.Task) (worker.Result, error) {
			if tk.Step < 2 {
				return worker.Continue(json.RawMessage(`{"from":` + string(rune('0'+tk.Step)) + `}`)), nil
			}
			return worker.Complete(tk.Input), nil
		},
	}})
	st := b.start(startOpts{Name: "steps"})
	b.wake("q")
	// Each continuation is due at once and pinned to this worker, so the
	// loop takes it without any wake-up.
	require.Equal(t, worker.OutcomeContinued, r.next(t, b.ctx).Outcome)
	require.Equal(t, worker.OutcomeContinued, r.next(t, b.ctx).Outcome)
	f := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeCompleted, f.Outcome)
	require.Equal(t, 2, f.Task.Step)

	run := b.run("acme", st.Run.ID)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `{"from":1}`, string(run.Output))
	var sticky []string
	rows, err := b.db.Query(b.ctx, `SELECT coalesce(sticky_worker, '') FROM tasks ORDER BY step`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		sticky = append(sticky, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"", "w1", "w1"}, sticky)
}

func TestRunTimeoutEndsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cause := make(chan error, 1)
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"slow": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
			require.False(t, tk.Deadline.IsZero())
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return worker.Result{}, ctx.Err()
		},
	}})
	st := b.start(startOpts{Name: "slow", MaxAttempts: 1, Timeout: 20 * time.Millisecond})
	b.wake("q")
	require.Equal(t, worker.OutcomeFailed, r.next(t, b.ctx).Outcome)
	require.ErrorIs(t, <-cause, worker.ErrAttemptTimeout)
	require.Contains(t, *b.run("acme", st.Run.ID).Error, "attempt timed out after 20ms")
}

// blocker is a handler that reports when it starts and then waits for its
// context to end, reporting the cause.
type blocker struct {
	started chan worker.Task
	cause   chan error
	result  atomic.Pointer[worker.Result]
}

func newBlocker() *blocker {
	return &blocker{started: make(chan worker.Task, 10), cause: make(chan error, 10)}
}

func (h *blocker) handle(ctx context.Context, tk worker.Task) (worker.Result, error) {
	h.started <- tk
	<-ctx.Done()
	h.cause <- context.Cause(ctx)
	if r := h.result.Load(); r != nil {
		return *r, nil // pretend the work finished anyway
	}
	return worker.Result{}, ctx.Err()
}

func TestCancelledRunReachesHandlerAtHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newBlocker()
	h.result.Store(&worker.Result{Output: json.RawMessage(`"too late"`)})
	r := b.worker(workerOpts{
		Config:   func(c *worker.Config) { c.HeartbeatInterval = 10 * time.Millisecond },
		Handlers: map[string]worker.HandlerFunc{"block": h.handle},
	})
	st := b.start(startOpts{Name: "block"})
	b.wake("q")
	<-h.started
	// What the cancel route does: the run becomes final, its slot is freed.
	_, err := b.db.Exec(b.ctx, `SELECT harvest_run_finish(pk, 'cancelled', NULL, 'cancelled by test') FROM runs WHERE id = $1`, st.Run.ID)
	require.NoError(t, err)

	require.ErrorIs(t, <-h.cause, worker.ErrRunCancelled)
	require.Equal(t, worker.OutcomeDiscarded, r.next(t, b.ctx).Outcome)
	run := b.run("acme", st.Run.ID)
	require.Equal(t, api.StatusCancelled, run.Status)
	require.Nil(t, run.Output, "the handler's result is discarded")
	var state string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT state FROM tasks WHERE id = $1`, st.TaskID).Scan(&state))
	require.Equal(t, "done", state)
}

func TestLostLeaseCancelsHandlerAndDropsResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newBlocker()
	h.result.Store(&worker.Result{Output: json.RawMessage(`"stale"`)})
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) {
			c.HeartbeatInterval = 10 * time.Millisecond
			c.ShutdownGrace = 0 // a re-claimed attempt blocks; don't wait for it at cleanup
		},
		Handlers: map[string]worker.HandlerFunc{"block": h.handle},
	})
	st := b.start(startOpts{Name: "block"})
	b.wake("q")
	<-h.started
	// The lease runs out (as if the worker had been paused) and the
	// janitor rescues the task, in one transaction: the row stays locked
	// from the expiry to the rescue, so the worker's heartbeat (every
	// 10 ms) cannot extend the lease in between; it waits, then finds
	// the lease gone.
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
	_, err = tx.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, st.TaskID)
	require.NoError(t, err)
	rescued, err := claim.RescueExpired(b.ctx, tx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, rescued.Requeued)
	require.NoError(t, tx.Commit(b.ctx))

	require.ErrorIs(t, <-h.cause, worker.ErrLeaseLost)
	require.Equal(t, worker.OutcomeDiscarded, r.next(t, b.ctx).Outcome)
	// The rescued task may already be claimed again (the worker keeps
	// polling), but the lost attempt's result was never written.
	run := b.run("acme", st.Run.ID)
	require.Contains(t, []api.Status{api.StatusQueued, api.StatusRunning}, run.Status)
	require.Nil(t, run.Output)
}

func TestStopHandsBackWhatIsLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newBlocker()
	quick := make(chan struct{})
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) {
			c.MaxConcurrentClaims = 2
			c.ShutdownGrace = 0
		},
		Handlers: map[string]worker.HandlerFunc{
			"block": h.handle,
			"quick": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
				close(quick)
				return worker.Complete(nil), nil
			},
		},
	})
	r.waitIdle(t, b.ctx, 2)
	st := b.start(startOpts{Name: "block"})
	b.wake("q")
	<-h.started
	r.Stop(t)

	require.ErrorIs(t, <-h.cause, worker.ErrShutdown)
	require.Equal(t, worker.OutcomeReleased, r.next(t, b.ctx).Outcome)
	run := b.run("acme", st.Run.ID)
	require.Equal(t, api.StatusQueued, run.Status)
	require.Zero(t, run.Attempts, "a handed-back attempt does not count")
	var state string
	var attempt int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT state, attempt FROM tasks WHERE id = $1`, st.TaskID).Scan(&state, &attempt))
	require.Equal(t, "pending", state)
	require.Zero(t, attempt)

	// Another worker takes it up from where it was.
	h.result.Store(nil)
	r2 := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"block": func(context.Context, worker.Task) (worker.Result, error) { return worker.Complete(nil), nil },
	}})
	f := r2.next(t, b.ctx)
	require.Equal(t, worker.OutcomeCompleted, f.Outcome)
	require.Equal(t, 1, f.Task.Attempt)
	_ = quick
}

func TestStopLetsRunningTasksFinishWithinGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	started := make(chan struct{})
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"work": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
			close(started)
			select {
			case <-release:
				return worker.Complete(json.RawMessage(`"done"`)), nil
			case <-ctx.Done():
				return worker.Result{}, ctx.Err()
			}
		},
	}})
	st := b.start(startOpts{Name: "work"})
	b.wake("q")
	<-started
	stopped := make(chan struct{})
	go func() {
		r.Stop(t)
		close(stopped)
	}()
	close(release)
	<-stopped
	require.Equal(t, worker.OutcomeCompleted, r.next(t, b.ctx).Outcome)
	require.Equal(t, api.StatusCompleted, b.run("acme", st.Run.ID).Status)
}

func TestDispatchClaimsTheNamedRowOrClaimsFairly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Put key "heavy" in debt: claim and finish one of its tasks fairly.
	first := b.start(startOpts{Key: "heavy"})
	res, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "q", Worker: "other", Fair: true})
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, first.TaskID, res.Task.ID)
	require.NoError(t, claim.Complete(b.ctx, b.db, res.Task.ID, res.Task.LeaseToken, nil))

	r := b.worker(workerOpts{Config: func(c *worker.Config) { c.FairnessKeys = true }})
	r.waitIdle(t, b.ctx, 1)

	// Alone in the queue, the dispatched row is claimed by id.
	only := b.start(startOpts{Key: "heavy"})
	require.NoError(t, dispatch.Publish(b.ctx, b.nc, dispatch.Subjects{}.Dispatch(0, "q"), dispatch.Dispatch{TaskID: only.TaskID, Queue: "q"}))
	f := r.next(t, b.ctx)
	require.Equal(t, only.TaskID, f.Task.ID)
	r.waitIdle(t, b.ctx, 1)

	// With a backlog, a dispatch of the indebted key's row is a wake-up:
	// the key without debt goes first.
	heavy := b.start(startOpts{Key: "heavy"})
	light := b.start(startOpts{Key: "light"})
	require.NoError(t, dispatch.Publish(b.ctx, b.nc, dispatch.Subjects{}.Dispatch(0, "q"), dispatch.Dispatch{TaskID: heavy.TaskID, Queue: "q"}))
	require.Equal(t, light.TaskID, r.next(t, b.ctx).Task.ID)
	require.Equal(t, heavy.TaskID, r.next(t, b.ctx).Task.ID)
}

func TestWorkerRefusesABadQueueNameWhenFair(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.FairnessKeys = true
	cfg.Queues = map[string]float64{"ok": 1, " padded": 1}
	err := cfg.Validate()
	var ce *worker.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Queues", ce.Field)
	require.Contains(t, err.Error(), `" padded"`)

	cfg.FairnessKeys = false
	require.NoError(t, cfg.Validate(), "without fairness keys the weight API's rule does not apply")
}

// Validate names the Go field at fault, and New refuses what Validate
// refuses.
func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	require.NoError(t, worker.DefaultConfig().Validate())
	cases := map[string]func(*worker.Config){
		"Shard":                    func(c *worker.Config) { c.Shard = -1 },
		"Queues":                   func(c *worker.Config) { c.Queues = map[string]float64{"q": 0} },
		"MaxConcurrentClaims":      func(c *worker.Config) { c.MaxConcurrentClaims = 0 },
		"PriorityAgingSecs":        func(c *worker.Config) { c.PriorityAgingSecs = -1 },
		"PollInterval":             func(c *worker.Config) { c.PollInterval = 0 },
		"HeartbeatInterval":        func(c *worker.Config) { c.HeartbeatInterval = c.Lease },
		"ShutdownGrace":            func(c *worker.Config) { c.ShutdownGrace = -time.Second },
		"RetryMax":                 func(c *worker.Config) { c.RetryMax = c.RetryBase / 2 },
		"Janitor.Retention":        func(c *worker.Config) { c.Janitor.Retention = 0 },
		"Janitor.BucketIdleWindow": func(c *worker.Config) { c.Janitor.BucketIdleWindow = 0 },
	}
	for field, mutate := range cases {
		c := testConfig()
		c.Queues = map[string]float64{"q": 1}
		mutate(&c)
		err := c.Validate()
		var ce *worker.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.True(t, strings.HasPrefix(err.Error(), "worker: Config."+field+": "), "%s: %v", field, err)
		require.NotContains(t, err.Error(), "HARVEST_", "a library error names no variable")
		_, err = worker.New(&pgxpool.Pool{}, c, worker.Options{})
		require.ErrorAs(t, err, &ce, field)
	}
	c := worker.DefaultConfig()
	c.Janitor.BucketGC, c.Janitor.BucketIdleWindow = false, 0
	require.NoError(t, c.Validate(), "the idle window only matters while the GC is on")
}
