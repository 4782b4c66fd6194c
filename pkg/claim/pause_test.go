package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The waits of the pause test: conditions, bounded generously for a loaded
// machine under the race detector.
const (
	waitLong  = 2 * time.Minute
	pollEvery = 10 * time.Millisecond
)

// TestPauseStopsEveryClaimer pauses a queue while claim loops of every
// kind (single, batch, combined by a Claimer; fair and ordinary) take its
// tasks, complete half of them, and starts and cancels keep committing, at
// 1, 4 and 16 loops: once Pause has
// returned, no claim that began after it takes a task; after the resume
// every task is claimed.
func TestPauseStopsEveryClaimer(t *testing.T) {
	t.Parallel()
	for _, loops := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const queue = "paused q"
			const before = 200
			for i := range before {
				b.task(taskOpts{Queue: queue, Key: fmt.Sprintf("k%d", i%5)})
			}
			var (
				pausedDone atomic.Bool // Pause has returned
				resumed    atomic.Bool
				late       atomic.Int64 // tasks taken by claims begun after the pause returned
				sincePause atomic.Int64 // claim calls begun after the pause returned
				claimed    sync.Map     // task id -> true
				wg         sync.WaitGroup
			)
			ctx, stop := context.WithCancel(b.ctx)
			defer stop()
			claimer := claim.NewClaimer(b.db)
			record := func(began bool, rs ...claim.Result) {
				for _, r := range rs {
					if !r.OK {
						continue
					}
					// Half the tasks complete at once, so completions
					// commit beside the claims and the pause.
					if r.Task.ID%2 == 0 {
						// A cancel that came after the claim voids the lease.
						err := claim.Complete(ctx, b.db, r.Task.ID, r.Task.LeaseToken, nil)
						if err != nil && !errors.Is(err, claim.ErrStaleLease) && ctx.Err() == nil {
							t.Errorf("complete: %v", err)
						}
					}
					if _, dup := claimed.LoadOrStore(r.Task.ID, true); dup {
						t.Errorf("task %d claimed twice", r.Task.ID)
					}
					if began && !resumed.Load() {
						late.Add(1)
					}
				}
			}
			for l := range loops {
				wg.Go(func() {
					req := claim.Request{Queue: queue, Worker: fmt.Sprintf("w%d", l), Fair: l%2 == 0}
					for ctx.Err() == nil {
						began := pausedDone.Load()
						if began {
							sincePause.Add(1)
						}
						var err error
						switch l % 3 {
						case 0:
							var r claim.Result
							r, err = claim.Claim(ctx, b.db, req)
							record(began, r)
						case 1:
							var rs []claim.Result
							rs, err = claim.ClaimBatch(ctx, b.db, req, 8)
							record(began, rs...)
						default:
							var r claim.Result
							r, err = claimer.Claim(ctx, req)
							record(began, r)
						}
						if err != nil && ctx.Err() == nil {
							t.Errorf("claim: %v", err)
							return
						}
					}
				})
			}
			// Starts commit while the loops claim and while the queue is
			// paused.
			var added atomic.Int64
			wg.Go(func() {
				for i := 0; ctx.Err() == nil && i < 300; i++ {
					testfactory.Task(ctx, t, b.db, testfactory.TaskOpts{Queue: queue, Key: fmt.Sprintf("k%d", i%7)})
					added.Add(1)
				}
			})
			// Cancels commit too: runs of the queue still waiting.
			var cancelled atomic.Int64
			wg.Go(func() {
				for ctx.Err() == nil && cancelled.Load() < 40 {
					var tenant, id string
					err := b.db.QueryRow(ctx, `SELECT r.tenant, r.id FROM runs r JOIN tasks x ON x.run_pk = r.pk
						WHERE x.queue = $1 AND x.state = 'pending' ORDER BY x.id DESC LIMIT 1`, queue).Scan(&tenant, &id)
					if err != nil {
						continue // none waiting right now, or the test ends
					}
					if res, err := runstore.Cancel(ctx, b.db, tenant, id, 0, "test"); err == nil && res.Cancelled {
						cancelled.Add(1)
					}
				}
			})
			shard := []weights.Shard{{Index: 0, DB: b.db}}
			res, err := weights.Pause(b.ctx, shard, "test", queue, true)
			require.NoError(t, err)
			require.Equal(t, 200, res.Status())
			require.True(t, res.Shards[0].Changed)
			pausedDone.Store(true)
			// Wait until every loop has tried many times since the pause.
			require.Eventually(t, func() bool { return sincePause.Load() >= int64(40*loops) }, waitLong, pollEvery)
			require.Zero(t, late.Load(), "claims begun after the pause returned took tasks")

			keys, err := weights.Keys(b.ctx, shard, queue, 0)
			require.NoError(t, err)
			require.Equal(t, []int{0}, keys.PausedShards)
			require.NotNil(t, keys.Shards[0].Paused)
			require.Equal(t, "test", keys.Shards[0].Paused.By)

			// Pausing again changes nothing; resuming lets every task go.
			again, err := weights.Pause(b.ctx, shard, "test", queue, true)
			require.NoError(t, err)
			require.False(t, again.Shards[0].Changed)
			resumed.Store(true)
			res, err = weights.Pause(b.ctx, shard, "test", queue, false)
			require.NoError(t, err)
			require.True(t, res.Shards[0].Changed)
			require.Nil(t, res.Shards[0].Paused)
			count := func() int {
				n := 0
				claimed.Range(func(_, _ any) bool { n++; return true })
				return n
			}
			// Every task is claimed or was cancelled before a claim.
			waiting := func() int {
				var n int
				require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE queue = $1 AND state IN ('pending', 'scheduled')`, queue).Scan(&n))
				return n
			}
			untouched := func() int {
				var n int
				require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE queue = $1 AND claimed_at IS NULL`, queue).Scan(&n))
				return n
			}
			// A claim the database committed is recorded once its call
			// returns: wait for the loops to catch up, not for a moment.
			require.Eventually(t, func() bool {
				return added.Load() == 300 && waiting() == 0 && count()+untouched() == before+300
			}, waitLong, pollEvery, "a task neither claimed nor cancelled")
			stop()
			wg.Wait()

			var audited int
			require.NoError(t, b.db.QueryRow(b.ctx,
				`SELECT count(*) FROM audit WHERE queue = $1 AND action IN ('queue.pause', 'queue.resume')`, queue).Scan(&audited))
			require.Equal(t, 3, audited)
		})
	}
}
