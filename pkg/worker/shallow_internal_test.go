package worker

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// A batch claim that comes back short marks its queue shallow, one that
// comes back full clears the mark, and the next batch of a marked queue is
// sent claim.Request.Shallow: with two rows waiting it takes them by
// single steps and plans nothing in bulk, where an unmarked one plans.
func TestBatchClaimShortMarksTheQueueShallow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One session that counts its PL/pgSQL calls: the worker's claims and
	// the reads of the counts share it (a session's counts reach the
	// statistics views once it flushes them).
	pc, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	pc.MaxConns = 1
	pc.ConnConfig.RuntimeParams["track_functions"] = "pl"
	db, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	calls := func(fn string) int {
		t.Helper()
		_, err := db.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
			WHERE funcname = $1`, fn).Scan(&n))
		return n
	}
	add := func(n int) {
		t.Helper()
		for i := range n {
			testfactory.Task(ctx, t, db, testfactory.TaskOpts{Key: fmt.Sprintf("k%d", i%3)})
		}
	}
	cfg := DefaultConfig()
	cfg.Queues = map[string]float64{"q": 1}
	cfg.FairnessKeys = true
	w, err := New(db, cfg, Options{})
	require.NoError(t, err)
	shallow := w.shallow["q"]
	require.False(t, shallow.Load(), "a new worker expects a full queue")
	// claim takes a batch of 4 and returns the rows, and the single and
	// bulk steps it took.
	claim := func() (rows, steps, bulk int) {
		t.Helper()
		s0, b0 := calls("harvest_claim_step"), calls("harvest_claim_bulk_fair")
		cs, err := w.claimBatchOne(ctx, "q", 4)
		require.NoError(t, err)
		return len(cs), calls("harvest_claim_step") - s0, calls("harvest_claim_bulk_fair") - b0
	}

	rows, _, _ := claim()
	require.Zero(t, rows)
	require.True(t, shallow.Load(), "after an empty claim")

	add(2)
	rows, steps, bulk := claim()
	require.Equal(t, 2, rows)
	require.Equal(t, 3, steps, "the marked batch's single steps: two rows, then none")
	require.Zero(t, bulk, "the marked batch plans nothing in bulk")
	require.True(t, shallow.Load(), "after a short claim")

	add(6)
	rows, _, _ = claim()
	require.Equal(t, 4, rows)
	require.False(t, shallow.Load(), "after a full claim")

	rows, _, bulk = claim() // the 2 rows left, unmarked
	require.Equal(t, 2, rows)
	require.Positive(t, bulk, "an unmarked batch plans in bulk")
	require.True(t, shallow.Load(), "after a short claim")
}
