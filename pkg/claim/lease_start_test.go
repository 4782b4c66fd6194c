package claim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// A claim may wait on the queue's lock for longer than the lease it hands
// out; the lease still runs its full length from the moment the row is
// leased, never from the start of the claim's transaction (which once
// handed out leases already expired, for the rescue to take back while
// the worker ran them).
func TestLeaseRunsFromTheClaimNotFromItsWait(t *testing.T) {
	t.Parallel()
	const lease = 50 * time.Millisecond
	for _, batch := range []bool{false, true} {
		name := map[bool]string{false: "single claim", true: "batch"}[batch]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.tasks(2, taskOpts{Key: "a", DueAt: t0})
			b.tasks(2, taskOpts{Key: "b", DueAt: t0})
			req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: lease}

			// Hold the queue's lock until the claim has waited for it
			// twice the lease, by the database's clock.
			holder, err := b.db.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(b.ctx) }()
			_, err = holder.Exec(b.ctx, `SELECT harvest_queue_lock('q')`)
			require.NoError(t, err)
			done := make(chan claimed, 1)
			go func() {
				if batch {
					rs, err := claim.ClaimBatch(b.ctx, b.db, req, 4)
					done <- claimed{rs, err}
					return
				}
				r, err := claim.Claim(b.ctx, b.db, req)
				done <- claimed{[]claim.Result{r}, err}
			}()
			waitForLockWait(t, b, 2*lease, "the claim never waited on the queue's lock")
			require.NoError(t, holder.Commit(b.ctx))

			g := <-done
			require.NoError(t, g.err)
			require.NotEmpty(t, g.rs)
			for _, r := range g.rs {
				require.True(t, r.OK)
				var held time.Duration
				var us int64
				require.NoError(t, b.db.QueryRow(b.ctx, `SELECT harvest_us(lease_expires_at, claimed_at) FROM tasks WHERE id = $1`,
					r.Task.ID).Scan(&us))
				held = time.Duration(us) * time.Microsecond
				require.Equal(t, lease, held, "task %d: lease from its claim to its expiry", r.Task.ID)
			}
		})
	}
}

// While a queue has one key with work, batches lock their rows side by
// side and then wait for the key's state row to charge them (the lone
// step). A lease made before that wait would have run from a moment the
// worker had not got its rows yet; it runs from after the wait.
func TestLoneBatchLeaseRunsFromAfterItsWaitForTheKey(t *testing.T) {
	t.Parallel()
	const lease = 50 * time.Millisecond
	b := setup(t)
	b.tasks(6, taskOpts{Key: "a", DueAt: t0})
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: lease}
	// A first claim folds the key in, so that the queue has one key with
	// work and the next batch takes the lone step.
	first, err := claim.Claim(b.ctx, b.db, req)
	require.NoError(t, err)
	require.True(t, first.OK)

	holder, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, err = holder.Exec(b.ctx, `SELECT 1 FROM fair_state WHERE queue = 'q' AND key = 'a' FOR UPDATE`)
	require.NoError(t, err)
	done := make(chan claimed, 1)
	go func() {
		rs, err := claim.ClaimBatch(b.ctx, b.db, req, 4)
		done <- claimed{rs, err}
	}()
	waitForLockWait(t, b, 2*lease, "the batch never waited for the key's state row")
	var released time.Time
	require.NoError(t, holder.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&released))
	require.NoError(t, holder.Commit(b.ctx))

	g := <-done
	require.NoError(t, g.err)
	require.Len(t, g.rs, 4)
	for _, r := range g.rs {
		require.True(t, r.OK)
		var claimedAt, expires time.Time
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT claimed_at, lease_expires_at FROM tasks WHERE id = $1`,
			r.Task.ID).Scan(&claimedAt, &expires))
		require.False(t, claimedAt.Before(released), "task %d leased at %v, before the batch got the key at %v",
			r.Task.ID, claimedAt, released)
		require.Equal(t, lease, expires.Sub(claimedAt), "task %d: lease from its claim to its expiry", r.Task.ID)
	}
}

// claimed is what a claim sent off on its own goroutine returned.
type claimed struct {
	rs  []claim.Result
	err error
}

// waitForLockWait waits until a statement of b's database has waited on a
// lock for longer than d, by the database's clock (its transaction began
// that long ago and it is still waiting).
func waitForLockWait(t *testing.T, b *bundle, d time.Duration, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waited bool
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND xact_start < now() - $1 * interval '1 microsecond')`, d.Microseconds()).Scan(&waited))
		return waited
	}, time.Minute, 5*time.Millisecond, msg)
}
