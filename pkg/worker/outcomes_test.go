package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/worker"
)

// trackedPool is a pool on the bundle's database whose sessions count the
// calls of every PL/pgSQL function (pg_stat_user_functions), so a test can
// tell which statements a worker sent. Closing it flushes its counts.
func (b *bundle) trackedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.Config().ConnString())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["track_functions"] = "pl"
	cfg.ConnConfig.RuntimeParams["application_name"] = trackedApp
	db, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

const trackedApp = "harvest-worker-tracked"

// functionCalls reads the calls of the named functions once every session
// of the tracked pool has ended: a session flushes its counts as it ends,
// before it leaves pg_stat_activity.
func (b *bundle) functionCalls(t *testing.T, names ...string) map[string]int {
	t.Helper()
	calls := map[string]int{}
	require.Eventually(t, func() bool {
		var sessions int
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, trackedApp).Scan(&sessions))
		return sessions == 0
	}, time.Minute, 10*time.Millisecond, "the tracked sessions end")
	rows, err := b.db.Query(b.ctx, `SELECT funcname, calls FROM pg_stat_user_functions WHERE funcname = ANY ($1)`, names)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Name  string
		Calls int
	}])
	require.NoError(t, err)
	for _, g := range got {
		calls[g.Name] = g.Calls
	}
	return calls
}

// Every outcome a worker records, of every kind, goes through its outcome
// batches, in both claim modes: no completion, continuation, failure,
// retry or release is written by a statement of its own, and heartbeats
// are one statement for all the tasks running. Each caller is answered
// after the commit (the Finished hook sees the outcome from another
// session), and every run that ended is announced once, from what the
// batch statement returned.
func TestEveryOutcomeGoesThroughTheBatches(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprintf("claim batch %d", batch), func(t *testing.T) {
			b := setup(t)
			tracked := b.trackedPool(t)
			events, err := b.nc.SubscribeSync("harvest.runs.acme.>")
			require.NoError(t, err)
			require.NoError(t, b.nc.Flush())

			var mu sync.Mutex
			var problems []string
			problem := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				problems = append(problems, fmt.Sprintf(format, args...))
			}
			// Each outcome, as the hook sees it, is committed already.
			checkCommitted := func(tk worker.Task, out worker.Outcome, err error) {
				if err != nil {
					problem("task %d: %s: %v", tk.ID, out, err)
					return
				}
				if out == worker.OutcomeReleased || out == worker.OutcomeDiscarded {
					return
				}
				var (
					state   string
					attempt int
					status  string
					next    int
				)
				qerr := b.db.QueryRow(b.ctx, `SELECT t.state, t.attempt, r.status,
					(SELECT count(*) FROM tasks x WHERE x.run_pk = t.run_pk AND x.id > t.id)
					FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE t.id = $1`, tk.ID).Scan(&state, &attempt, &status, &next)
				switch {
				case qerr != nil:
					problem("task %d: %v", tk.ID, qerr)
				case state == "running" && attempt == tk.Attempt:
					problem("task %d: %s answered before its commit (still running)", tk.ID, out)
				case out == worker.OutcomeCompleted && status != "completed",
					out == worker.OutcomeFailed && status != "failed":
					problem("task %d: %s answered before its commit (run %s)", tk.ID, out, status)
				case out == worker.OutcomeContinued && next == 0:
					problem("task %d: continued answered before its commit (no next task)", tk.ID)
				}
			}
			blocked := make(chan worker.Task, 1)
			r := b.worker(workerOpts{
				DB: tracked,
				Config: func(c *worker.Config) {
					c.ClaimBatch = batch
					c.MaxConcurrentClaims = 4
					c.CompleteBatch = 16
					c.PollInterval = 5 * time.Millisecond
					c.HeartbeatInterval = 5 * time.Millisecond
					c.ShutdownGrace = 0
				},
				Hooks: worker.Hooks{Finished: checkCommitted},
				Handlers: map[string]worker.HandlerFunc{
					"steps": func(_ context.Context, tk worker.Task) (worker.Result, error) {
						if tk.Step < 2 {
							return worker.Continue(json.RawMessage(`{}`)), nil
						}
						return worker.Complete(json.RawMessage(`"steps"`)), nil
					},
					"flaky": func(_ context.Context, tk worker.Task) (worker.Result, error) {
						if tk.Attempt < 2 {
							return worker.Result{}, errors.New("not yet")
						}
						return worker.Complete(json.RawMessage(`"flaky"`)), nil
					},
					"broken": func(context.Context, worker.Task) (worker.Result, error) {
						return worker.Result{}, worker.Permanent(errors.New("bad input"))
					},
					// Runs until its lease was extended by a heartbeat.
					"slow": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
						var first, now time.Time
						if err := b.db.QueryRow(ctx, `SELECT lease_expires_at FROM tasks WHERE id = $1`, tk.ID).Scan(&first); err != nil {
							return worker.Result{}, err
						}
						for now.Compare(first) <= 0 {
							time.Sleep(2 * time.Millisecond)
							if err := b.db.QueryRow(ctx, `SELECT lease_expires_at FROM tasks WHERE id = $1`, tk.ID).Scan(&now); err != nil {
								return worker.Result{}, err
							}
						}
						return worker.Complete(nil), nil
					},
					"block": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
						// A claim in flight at the stop may take the task
						// again once the release made it pending; the
						// stopping worker gives it back without a second
						// call (TestStopGivesBackWhatAClaimUnderWayTook).
						// Should that break, a later call must not wait
						// for a reader that is gone.
						select {
						case blocked <- tk:
						case <-ctx.Done():
						}
						<-ctx.Done()
						return worker.Result{}, ctx.Err()
					},
				},
			})
			final := map[string]api.Status{}
			for range 3 {
				final[b.start(startOpts{Name: "steps", Notify: true}).Run.ID] = api.StatusCompleted
				final[b.start(startOpts{Name: "flaky", Notify: true}).Run.ID] = api.StatusCompleted
				final[b.start(startOpts{Name: "broken", Notify: true}).Run.ID] = api.StatusFailed
				final[b.start(startOpts{Name: "slow", Notify: true}).Run.ID] = api.StatusCompleted
				final[b.start(startOpts{Notify: true}).Run.ID] = api.StatusCompleted
			}
			want := map[worker.Outcome]int{
				worker.OutcomeContinued: 6, worker.OutcomeRetried: 3, worker.OutcomeFailed: 3, worker.OutcomeCompleted: 12,
			}
			got := map[worker.Outcome]int{}
			for n := 0; n < 24; n++ {
				f := r.next(t, b.ctx)
				got[f.Outcome]++
			}
			require.Equal(t, want, got)
			// Last, a task the stop hands back.
			held := b.start(startOpts{Name: "block"})
			<-blocked
			r.Stop(t)
			require.Equal(t, worker.OutcomeReleased, r.next(t, b.ctx).Outcome)
			require.Equal(t, api.StatusQueued, b.run("acme", held.Run.ID).Status)

			mu.Lock()
			require.Empty(t, problems)
			mu.Unlock()
			seen := map[string]bool{}
			for range final {
				msg, err := events.NextMsg(time.Minute)
				require.NoError(t, err)
				var ev api.Run
				require.NoError(t, json.Unmarshal(msg.Data, &ev))
				id := msg.Subject[strings.LastIndex(msg.Subject, ".")+1:]
				require.Equal(t, id, ev.ID)
				require.False(t, seen[id], "run %s announced twice", id)
				seen[id] = true
				stored := b.run("acme", id)
				require.Equal(t, final[id], ev.Status)
				require.Equal(t, stored.Status, ev.Status)
				require.Equal(t, stored.Attempts, ev.Attempts)
				wantOut, err := json.Marshal(stored.Output)
				require.NoError(t, err)
				require.JSONEq(t, string(wantOut), string(ev.Output))
				require.Equal(t, stored.Error, ev.Error)
				require.Equal(t, stored.FinishedAt.UTC().Format(api.TimeLayout), ev.FinishedAt.UTC().Format(api.TimeLayout))
				require.Equal(t, "acme", ev.Tenant)
				require.Equal(t, "q", ev.Queue)
			}

			tracked.Close()
			calls := b.functionCalls(t, "harvest_outcome_batch", "harvest_heartbeat_many",
				"harvest_complete", "harvest_fail", "harvest_continue", "harvest_heartbeat", "harvest_complete_batch")
			require.Positive(t, calls["harvest_outcome_batch"])
			require.Positive(t, calls["harvest_heartbeat_many"])
			for _, single := range []string{"harvest_complete", "harvest_fail", "harvest_continue", "harvest_heartbeat", "harvest_complete_batch"} {
				require.Zero(t, calls[single], "%s was called: an outcome or heartbeat went alone", single)
			}
		})
	}
}

// One heartbeat loop keeps the leases of every task a worker runs: each
// lease is extended while its handler runs; a lease another holder took
// ends its handler with ErrLeaseLost, a cancelled run with ErrRunCancelled,
// and the others go on to complete.
func TestHeartbeatLoopKeepsEveryLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 6
	h := newBlocker()
	release := make(chan struct{})
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) {
			batchConfig(c)
			c.HeartbeatInterval = 10 * time.Millisecond
			c.ShutdownGrace = 0
		},
		Handlers: map[string]worker.HandlerFunc{
			"block": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
				h.started <- tk
				select {
				case <-ctx.Done():
					h.cause <- context.Cause(ctx)
					return worker.Result{}, ctx.Err()
				case <-release:
					return worker.Complete(nil), nil
				}
			},
		},
	})
	for range n {
		b.start(startOpts{Name: "block"})
	}
	b.wake("q")
	var tasks []worker.Task
	for range n {
		tasks = append(tasks, <-h.started)
	}
	// Every lease moves on, by the one loop's heartbeats.
	first := map[int64]time.Time{}
	rows, err := b.db.Query(b.ctx, `SELECT id, lease_expires_at FROM tasks WHERE state = 'running'`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			id int64
			at time.Time
		)
		require.NoError(t, rows.Scan(&id, &at))
		first[id] = at
	}
	require.NoError(t, rows.Err())
	require.Len(t, first, n)
	ids := make([]int64, 0, n)
	ats := make([]time.Time, 0, n)
	for id, at := range first {
		ids, ats = append(ids, id), append(ats, at)
	}
	require.Eventually(t, func() bool {
		var behind int
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks t
			JOIN unnest($1::bigint[], $2::timestamptz[]) AS f(id, at) ON f.id = t.id
			WHERE t.lease_expires_at <= f.at`, ids, ats).Scan(&behind))
		return behind == 0
	}, time.Minute, 5*time.Millisecond, "every lease was extended")

	lost, cancelled := tasks[1], tasks[4]
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET lease_token = gen_random_uuid() WHERE id = $1`, lost.ID)
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `SELECT harvest_run_finish(pk, 'cancelled', NULL, 'by test') FROM runs WHERE id = $1`, cancelled.RunID)
	require.NoError(t, err)
	causes := []error{<-h.cause, <-h.cause}
	require.ElementsMatch(t, []error{worker.ErrLeaseLost, worker.ErrRunCancelled}, causes)
	close(release)
	outcomes := map[int64]worker.Outcome{}
	for range n {
		f := r.next(t, b.ctx)
		outcomes[f.Task.ID] = f.Outcome
	}
	for _, tk := range tasks {
		want := worker.OutcomeCompleted
		if tk.ID == lost.ID || tk.ID == cancelled.ID {
			want = worker.OutcomeDiscarded
		}
		require.Equal(t, want, outcomes[tk.ID], "task %d", tk.ID)
	}
	require.Equal(t, api.StatusCancelled, b.run("acme", cancelled.RunID).Status)
	require.Equal(t, api.StatusRunning, b.run("acme", lost.RunID).Status, "the lost attempt wrote nothing")
}
