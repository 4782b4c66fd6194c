package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/worker"
)

// A claim under way when the worker begins to stop is not cut short, and
// it can take the very task the stop has just handed back (the release
// makes it pending again with its attempt not counted, so the claim gets
// the same attempt). The stopping worker gives what such a claim took back
// without starting its handler: no handler starts after the stop began, one
// attempt never runs twice in one process, and the task is not lost.
//
// Not parallel: goleak compares the goroutines alive before and after.
func TestStopGivesBackWhatAClaimUnderWayTook(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprintf("claim batch %d", batch), func(t *testing.T) {
			b := setup(t)
			// Pending before the worker starts, so its first claim takes it.
			st := b.start(startOpts{Name: "block"})

			// The first two claims wait for the test: the first takes the
			// task, the second is held before its statement until the
			// stop has handed the task back. Later claims pass.
			var claims atomic.Int32
			claiming := make(chan chan struct{})
			calls := make(chan worker.Task, 10)
			r := b.worker(workerOpts{
				Config: func(c *worker.Config) {
					c.ClaimBatch = batch
					// Batch 1: two claim loops; batch 8: one claim loop
					// with a slot left for its next claim.
					c.MaxConcurrentClaims = 2
					c.BatchClaimers = 1
					c.ShutdownGrace = 0
				},
				Hooks: worker.Hooks{Claiming: func() {
					if claims.Add(1) > 2 {
						return
					}
					proceed := make(chan struct{})
					claiming <- proceed
					<-proceed
				}},
				Handlers: map[string]worker.HandlerFunc{
					"block": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
						calls <- tk
						<-ctx.Done()
						return worker.Result{}, ctx.Err()
					},
				},
			})
			close(<-claiming)
			first := <-calls
			require.Equal(t, st.TaskID, first.ID)
			held := <-claiming

			// Stop without waiting: Run waits for the held claim.
			r.stop()
			f := r.next(t, b.ctx)
			require.Equal(t, st.TaskID, f.Task.ID)
			require.Equal(t, worker.OutcomeReleased, f.Outcome)

			// The held claim now runs and takes the handed-back task.
			close(held)
			r.Stop(t)
			f = r.next(t, b.ctx)
			require.Equal(t, st.TaskID, f.Task.ID, "the claim under way took the handed-back task")
			require.Equal(t, first.Attempt, f.Task.Attempt, "the same attempt")
			require.Equal(t, worker.OutcomeReleased, f.Outcome, "the stopping worker gave it back")
			close(calls)
			for again := range calls {
				require.Failf(t, "a handler started after the stop",
					"task %d attempt %d ran again", again.ID, again.Attempt)
			}

			// Nothing is lost: the task waits for the next worker, its
			// attempt not counted.
			var (
				state   string
				attempt int
			)
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT state, attempt FROM tasks WHERE id = $1`, st.TaskID).Scan(&state, &attempt))
			require.Equal(t, "pending", state)
			require.Zero(t, attempt)
			require.Equal(t, api.StatusQueued, b.run("acme", st.Run.ID).Status)
		})
	}
}
