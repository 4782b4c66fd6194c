package claim_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
)

// statements counts the claim statements sent through it: a claim is one
// query (its own transaction), so every Query and every SendBatch counts.
type statements struct {
	shard.Querier
	n atomic.Int64
}

func (s *statements) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s.n.Add(1)
	return s.Querier.Query(ctx, sql, args...)
}

func (s *statements) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	s.n.Add(1)
	return s.Querier.SendBatch(ctx, b)
}

// Claim loops sharing a Claimer take every task exactly once, in fewer
// statements than claims, and in the fair order: the keys alternate.
func TestClaimerCombinesConcurrentFairClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.run(runOpts{})
	b.exec(`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT $1, 'q', 'k' || (g % 2) FROM generate_series(1, 400) g`, run)
	db := &statements{Querier: b.db}
	c := claim.NewClaimer(db)
	var (
		mu  sync.Mutex
		ids = map[int64]bool{}
		wg  sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for {
				r, err := c.Claim(b.ctx, claim.Request{Queue: "q", Worker: "w", Fair: true})
				if err != nil {
					t.Error(err)
					return
				}
				if !r.OK {
					return
				}
				mu.Lock()
				require.False(t, ids[r.Task.ID], "task %d claimed twice", r.Task.ID)
				ids[r.Task.ID] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, ids, 400)
	t.Logf("400 claims in %d statements", db.n.Load())
	require.Positive(t, db.n.Load(), "the statements went around the counter")
	require.Less(t, db.n.Load(), int64(400), "no claims were combined")
	// The claim order kept the keys alternating: within every pair of
	// claims, one of each key.
	rows, err := b.db.Query(b.ctx, `SELECT fairness_key FROM tasks ORDER BY claimed_at, id`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	lead := 0
	for _, k := range keys {
		if k == "k0" {
			lead++
		} else {
			lead--
		}
		require.LessOrEqual(t, max(lead, -lead), 1, "claims out of turn: %v", keys)
	}
}

// A claim waiting for its turn leaves when its context ends and takes no
// task with it; one already sent waits for its row. Here the queue's fair
// lock is held by hand, so the first claim's statement waits for it.
func TestClaimerWaitingClaimLeavesOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tasks(3, taskOpts{Key: "k"})
	c := claim.NewClaimer(b.db)
	hold, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer hold.Rollback(b.ctx) //nolint:errcheck
	_, err = hold.Exec(b.ctx, `SELECT harvest_queue_lock('q')`)
	require.NoError(t, err)

	req := claim.Request{Queue: "q", Worker: "w", Fair: true}
	first := make(chan claim.Result, 1)
	go func() {
		r, err := c.Claim(b.ctx, req)
		require.NoError(t, err)
		first <- r
	}()
	// The first claim's statement waits for the lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n > 0
	}, time.Minute, 2*time.Millisecond)
	ctx, cancel := context.WithCancel(b.ctx)
	second := make(chan error, 1)
	go func() {
		_, err := c.Claim(ctx, req)
		second <- err
	}()
	cancel()
	require.True(t, errors.Is(<-second, context.Canceled))
	require.NoError(t, hold.Rollback(b.ctx))
	r := <-first
	require.True(t, r.OK)
	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE state = 'running'`).Scan(&running))
	require.Equal(t, 1, running, "only the claim that was sent took a task")
}

// Claims combined into a statement that stops at a refusal each get what a
// single claim would: the first the row it was given, the others the
// refusal.
func TestClaimerHandsTheRefusalToTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'cap', 1)`)
	b.tasks(4, taskOpts{Key: "k", QuotaKey: "cap"})
	c := claim.NewClaimer(b.db)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			r, err := c.Claim(b.ctx, claim.Request{Queue: "q", Worker: "w", Fair: true})
			require.NoError(t, err)
			switch {
			case r.OK:
				ok.Add(1)
			case r.Empty == claim.EmptyRefused:
				require.NotEmpty(t, r.Refused)
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, ok.Load(), "the cap lets one task run")
	require.EqualValues(t, 3, refused.Load())
}
