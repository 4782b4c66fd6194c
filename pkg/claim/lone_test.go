package claim_test

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// While a queue has one key with work, fair batches claim side by side
// under the shared lock (harvest_claim_lone.sql). They must still take each
// row once, charge the key for every claim exactly, and give way as soon
// as a second key arrives: its first rows are claimed long before the
// flood runs out.
func TestLoneKeyBatchesChargeExactlyAndYieldToANewKey(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		const flood = 2000
		f.setWeight("flood", 2)
		f.add("flood", 0, flood)

		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			seen    = map[int64]bool{}
			dups    int
			claimed atomic.Int64
			errs    = make(chan error, c)
			// The late key arrives once a quarter of the flood is claimed:
			// the loops that claimed past that mark wait for it, so that it
			// arrives while the flood still has rows however the loops are
			// scheduled (on a busy machine they could drain the whole flood
			// before the test's goroutine ran, and stop before the late key
			// came).
			quarter     = make(chan struct{})
			quarterOnce sync.Once
			lateIn      = make(chan struct{})
		)
		for i := range c {
			db := f.pools[i%len(f.pools)]
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			wg.Go(func() {
				req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour}
				for f.ctx.Err() == nil {
					rs, err := claim.ClaimBatch(f.ctx, db, req, 2+rng.IntN(49))
					if err != nil {
						errs <- err
						return
					}
					var took []claim.Completion
					mu.Lock()
					for _, r := range rs {
						if r.OK {
							if seen[r.Task.ID] {
								dups++
							}
							seen[r.Task.ID] = true
							took = append(took, claim.Completion{ID: r.Task.ID, Token: r.Task.LeaseToken})
						}
					}
					mu.Unlock()
					if len(took) == 0 {
						if f.pending("flood") == 0 && f.pending("late") == 0 {
							return
						}
						continue
					}
					n := claimed.Add(int64(len(took)))
					if _, err := claim.CompleteBatch(f.ctx, db, took); err != nil {
						errs <- err
						return
					}
					if n >= flood/4 {
						quarterOnce.Do(func() { close(quarter) })
						select {
						case <-lateIn:
						case <-f.ctx.Done():
							return
						}
					}
				}
			})
		}
		// A second key arrives once a quarter of the flood is claimed.
		select {
		case <-quarter:
		case <-f.ctx.Done():
		}
		f.add("late", 0, 3)
		var before int
		require.NoError(t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks
			WHERE queue = 'q' AND fairness_key = 'flood' AND state <> 'pending'`).Scan(&before))
		close(lateIn)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}

		require.Zero(t, dups, "rows claimed twice")
		require.Len(t, seen, flood+3)
		// Weight 2 from a clock of 0: the flood's claims start at 0,
		// 0.5, 1, ...; the late key's three claims each started at the
		// clock of their time, so they add no pass to the flood.
		var pass float64
		require.NoError(t, f.db().QueryRow(f.ctx, `SELECT pass FROM fair_state WHERE queue = 'q' AND key = 'flood'`).Scan(&pass))
		require.Equal(t, float64(flood)/2, pass, "the flood was charged for every claim, once")
		// The late key gave way at once: after its start committed, the
		// flood took only the batches already under way (at most one
		// per loop, of up to 50) and the few claims whose tags come
		// before the late key's third, not the rest of its backlog.
		var upTo int
		require.NoError(t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks
			WHERE queue = 'q' AND fairness_key = 'flood'
			  AND claimed_at <= (SELECT max(claimed_at) FROM tasks WHERE queue = 'q' AND fairness_key = 'late')`).Scan(&upTo))
		require.LessOrEqual(t, upTo-before, c*50+10, "the late key waited for the flood")
	})
}

// A lone batch looks at the queue before it takes the shared lock. Should
// an exclusive claim hold the lock meanwhile and fold in a second key, the
// batch must see that once it has the lock and claim in the shared order
// instead: the new key, whose tag is the clock, before the key in debt.
func TestLoneBatchRechecksTheQueueUnderTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.run(runOpts{MaxAttempts: 100})
	b.tasks(5, taskOpts{RunPK: run, Key: "a"})
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour}
	// One claim puts a in debt: its pass is 1, the clock 0.
	rs, err := claim.ClaimBatch(b.ctx, b.db, req, 2)
	require.NoError(t, err)
	require.Len(t, rs, 2)

	holder, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer holder.Rollback(b.ctx) //nolint:errcheck
	_, err = holder.Exec(b.ctx, `SELECT harvest_queue_lock('q')`)
	require.NoError(t, err)

	done := make(chan []claim.Result, 1)
	go func() {
		rs, err := claim.ClaimBatch(b.ctx, b.db, req, 2)
		if err != nil {
			t.Error(err)
		}
		done <- rs
	}()
	// The batch has looked (a alone) and waits for the lock.
	for {
		var n int
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n))
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	late, err := claim.Enqueue(b.ctx, holder, claim.NewTask{RunPK: run, Queue: "q", Key: "b"})
	require.NoError(t, err)
	_, err = holder.Exec(b.ctx, `SELECT harvest_fair_fold('q')`)
	require.NoError(t, err)
	require.NoError(t, holder.Commit(b.ctx))

	rs = <-done
	require.Len(t, rs, 2)
	require.Contains(t, ids(rs), late, "the batch claimed the key in debt before the new one")
}
