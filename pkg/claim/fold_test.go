package claim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// A row taken before the fair claim folded its arrival (here by an
// ordinary claim, which never folds; in a fleet also by a pinned or named
// claim, or a bulk step that read it) must not become its key's head: the
// next fair batch would find that head taken, end its bulk plan there and
// fall back to a single claim to repair it. The fold puts the key's next
// pending row there instead, so the batch stays in bulk steps, and it
// takes exactly the rows the single claims would.
func TestFoldSkipsArrivalsAlreadyTaken(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	conn, calls := plCalls(t, batch)

	now := t0.Add(time.Hour)
	for _, b := range []*bundle{single, batch} {
		run := b.run(runOpts{MaxAttempts: 100})
		for i := range 30 {
			b.task(taskOpts{RunPK: run, Key: []string{"a", "b", "c"}[i%3],
				DueAt: t0.Add(time.Duration(i) * time.Second), Now: now})
		}
	}
	// The ordinary claims take the first rows of "a" and "b" before any
	// fair claim has folded their arrivals.
	ordinary := claim.Request{Queue: "q", Worker: "w", Lease: time.Minute, Now: now}
	for range 2 {
		a, b := single.claim(ordinary), batch.claim(ordinary)
		require.True(t, a.OK)
		require.Equal(t, a.Task.ID, b.Task.ID)
	}

	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Minute, Now: now}
	steps0 := calls(t, "harvest_claim_step")
	got, err := claim.ClaimBatch(batch.ctx, conn, req, 20)
	require.NoError(t, err)
	steps := calls(t, "harvest_claim_step") - steps0
	require.Len(t, got, 20)
	for i, g := range got {
		want := single.claim(req)
		require.True(t, want.OK)
		require.Equal(t, want.Task.ID, g.Task.ID, "row %d", i)
		require.Equal(t, want.Lag, g.Lag, "lag of row %d", i)
	}
	require.Zero(t, steps, "the batch fell back to single claims")

	var stale int
	require.NoError(t, batch.db.QueryRow(batch.ctx, `SELECT count(*) FROM fair_state f JOIN tasks t ON t.id = f.head_id
		WHERE t.state <> 'pending'`).Scan(&stale))
	require.Zero(t, stale, "heads that name rows no longer pending")
}
