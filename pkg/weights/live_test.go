package weights_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/weights"
)

// A flood of two keys on one queue, claimed fairly one claim at a time. A
// weight change made through the fan-out applies from the very next claim:
// the SQL claim picks exactly what the reference model picks when the
// model gets the same change at the same step, and the share of claims
// follows the new weight.
func TestWeightChangeAppliesAtNextClaim(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	shards := shardsOf(db)
	const queue = "flood"
	due := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := due.Add(time.Second)

	m := fairkeys.NewModel()
	for _, key := range []string{"a", "b"} {
		for _, id := range flood(t, db, queue, key, "", 150, due) {
			m.Insert(fairkeys.Task{ID: id, Queue: queue, Key: key, DueAt: due})
		}
	}
	step := func(n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for i := 0; i < n; i++ {
			r, err := claim.Claim(ctx, db, claim.Request{Queue: queue, Worker: "w", Now: now, Fair: true})
			require.NoError(t, err)
			require.True(t, r.OK)
			want := m.Claim(fairkeys.ClaimRequest{Queue: queue, Worker: "w", Now: now, Fair: true})
			require.True(t, want.OK)
			require.Equal(t, want.Task.ID, r.Task.ID, "claim %d: SQL and model differ", i)
			got[r.Task.Key]++
		}
		return got
	}

	require.Equal(t, map[string]int{"a": 20, "b": 20}, step(40), "equal weights: equal shares")

	res, err := weights.Set(ctx, shards, "ops", queue, "a", 3)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	m.SetWeight(queue, "a", 3)
	after := step(80)
	require.InDelta(t, 60, after["a"], 1, "weight 3 against 1: three claims in four, got %v", after)

	res, err = weights.Set(ctx, shards, "ops", queue, "b", 4)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	m.SetWeight(queue, "b", 4)
	after = step(70)
	require.InDelta(t, 40, after["b"], 1, "weight 4 against 3: got %v", after)

	cl, err := weights.Clear(ctx, shards, "ops", queue, "a")
	require.NoError(t, err)
	require.Equal(t, 200, cl.Status())
	m.ClearWeight(queue, "a")
	after = step(25)
	require.InDelta(t, 20, after["b"], 1, "weight 4 against 1: got %v", after)
}
