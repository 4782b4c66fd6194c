package claim_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// The janitor promotes due rows of every queue while a fair batch promotes
// its own queue's. Here the janitor holds the promotion of key a's rows (due
// first) when the batch comes: the batch must wait for them, not skip them
// and hand out a whole batch of key b, which is what a batch that skipped
// locked rows did.
func TestFairBatchWaitsForRowsTheJanitorPromotes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.tasks(10, taskOpts{Key: "a", DueAt: t0.Add(time.Second), Now: t0})
	c := b.tasks(10, taskOpts{Key: "b", DueAt: t0.Add(2 * time.Second), Now: t0})
	now := t0.Add(time.Minute)

	janitor, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer janitor.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
	n, err := claim.PromoteDue(b.ctx, janitor, "", now, len(a))
	require.NoError(t, err)
	require.Equal(t, len(a), n)

	type outcome struct {
		rs  []claim.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		rs, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "q", Fair: true, Now: now}, 10)
		done <- outcome{rs, err}
	}()
	// Either the batch waits on the janitor's row locks, or it came back
	// without waiting (the defect); both end this wait.
	var early *outcome
	require.Eventually(t, func() bool {
		select {
		case o := <-done:
			early = &o
			return true
		default:
		}
		var waiting bool
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, janitor.Commit(b.ctx))
	o := early
	if o == nil {
		got := <-done
		o = &got
	}
	require.NoError(t, o.err)
	require.Equal(t, []int64{a[0], c[0], a[1], c[1], a[2], c[2], a[3], c[3], a[4], c[4]}, ids(o.rs))
}

// A run's claimed_at is when its task was claimed, in the order of the
// batch that took it: the run list is how users (and harvest demo) see the
// claim order, and rows stamped with their transaction's start would tie
// within a batch and put a batch that waited for the queue lock before the
// one that held it.
func TestBatchStampsRunsInClaimOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		keys []string
		fair bool
	}{
		{"fair", []string{"a", "b"}, true},
		{"lone key", []string{"a"}, true},
		{"ordinary", []string{"a", "b"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, k := range tc.keys {
				b.tasks(10/len(tc.keys), taskOpts{Key: k})
			}
			rs, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "q", Fair: tc.fair}, 10)
			require.NoError(t, err)
			require.Len(t, rs, 10)
			var prev time.Time
			for i, r := range rs {
				var at time.Time
				require.NoError(t, b.db.QueryRow(b.ctx, `SELECT r.claimed_at FROM runs_seen r WHERE r.pk = $1`, r.Task.RunPK).Scan(&at))
				require.True(t, at.After(prev), "claim %d of the batch stamped %v, not after %v", i, at, prev)
				prev = at
			}
		})
	}
}

// The same at concurrency: 16 claimers taking fair batches of two keys
// (shared and exclusive lock paths both) and single claims, while new tasks
// keep committing. Every run's claimed_at is its task's claim stamp, so
// the run list orders claims as the claims happened.
func TestRunStampsAreTaskStampsAtConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"a", "b"} {
		b.tasks(100, taskOpts{Key: k})
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // starts committing meanwhile
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b.task(taskOpts{Key: []string{"a", "b", "c"}[i%3]})
		}
	})
	var claims sync.WaitGroup
	for c := range 16 {
		claims.Go(func() {
			for range 10 {
				n := 10
				if c%4 == 0 {
					n = 1
				}
				_, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "q", Fair: true}, n)
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	claims.Wait()
	close(stop)
	wg.Wait()
	var claimed, differ int
	require.NoError(t, b.db.QueryRow(b.ctx, `
		SELECT count(*), count(*) FILTER (WHERE r.claimed_at IS DISTINCT FROM t.claimed_at)
		FROM tasks t JOIN runs_seen r ON r.pk = t.run_pk WHERE t.claimed_at IS NOT NULL`).Scan(&claimed, &differ))
	require.Greater(t, claimed, 100)
	require.Zero(t, differ, "runs whose claimed_at is not their task's claim stamp")
}
