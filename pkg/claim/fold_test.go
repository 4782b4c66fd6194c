package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// Rows whose starts commit while a fair claim statement is under way are
// not in the key heads the statement folded at its start, and each later
// step of the statement sees them pending. A step that finds pending rows
// and no head folds again and takes the best of them by the heads; before,
// it fell back to sorting every pending row of the queue, for the rest of
// the statement (half the single steps of the mixed load did). One-level
// and two-level queues pick from their heads in functions of their own.
func TestClaimStepFoldsArrivalsCommittedDuringTheStatement(t *testing.T) {
	t.Parallel()
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("two_level=%v", two), func(t *testing.T) {
			t.Parallel()
			claimStepFoldsArrivals(t, two)
		})
	}
}

func claimStepFoldsArrivals(t *testing.T, two bool) {
	b := setup(t)
	b.exec(`SELECT harvest_queue_fairness_set('q', $1, 'claims', 'test')`, two)
	conn, calls := plCalls(t, b)
	now := t0.Add(time.Hour)
	run := b.run(runOpts{MaxAttempts: 100})
	sorts, folds := calls(t, "harvest_pick_fair_sort"), calls(t, "harvest_fair_fold")

	// The statement's start: the queue's fair lock, and a fold that finds
	// nothing.
	st := openClaimStatement(t, b, conn, now)
	require.Equal(t, two, st.twoLevel)
	// Starts commit meanwhile.
	var ids []int64
	for i := range 6 {
		ids = append(ids, b.task(taskOpts{RunPK: run, Key: []string{"a", "b"}[i%2],
			DueAt: t0.Add(time.Duration(i) * time.Second), Now: now}))
	}
	got := st.step(t)
	require.Equal(t, "ok", got.Outcome)
	require.NotNil(t, got.ID)
	require.Equal(t, ids[0], *got.ID, "not the first row of the fair order")

	require.Equal(t, sorts, calls(t, "harvest_pick_fair_sort"), "the step sorted the queue's pending rows")
	require.Equal(t, folds+2, calls(t, "harvest_fair_fold"), "the statement's fold and the step's")
	var heads []int64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT array_agg(head_id ORDER BY key) FROM fair_state WHERE queue = 'q'`).Scan(&heads))
	require.Equal(t, []int64{ids[2], ids[1]}, heads, "the keys' heads after the claim")
}

// The same in a two-level queue after a refusal: the step leaves out the
// refused head's key and picks again from every other key's head
// (harvest_pick_group_rows), which asks for a fresh look when due rows of
// a key without a head wait. Those are again rows committed after the
// statement's fold; the step folds once more and takes the best of them,
// not the full sort of the queue.
func TestClaimStepFoldsArrivalsAfterARefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'test')`)
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'capped', 1)`)
	conn, calls := plCalls(t, b)
	now := t0.Add(time.Hour)
	run := b.run(runOpts{MaxAttempts: 100})
	// Key g1/a: a running row holds the quota key's one place, and the
	// key's head carries the same quota key.
	first := b.task(taskOpts{RunPK: run, Key: "g1/a", QuotaKey: "capped", DueAt: t0, Now: now})
	head := b.task(taskOpts{RunPK: run, Key: "g1/a", QuotaKey: "capped", DueAt: t0.Add(time.Second), Now: now})
	taken := b.claim(claim.Request{Queue: "q", Worker: "w", Lease: time.Minute, Now: now})
	require.True(t, taken.OK)
	require.Equal(t, first, taken.Task.ID)
	sorts, folds := calls(t, "harvest_pick_fair_sort"), calls(t, "harvest_fair_fold")

	st := openClaimStatement(t, b, conn, now)
	require.True(t, st.twoLevel)
	// Key g2/b's rows commit after the statement's fold.
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.task(taskOpts{RunPK: run, Key: "g2/b", DueAt: t0.Add(time.Duration(2+i) * time.Second), Now: now}))
	}
	got := st.step(t)
	require.Equal(t, "ok", got.Outcome)
	require.Len(t, got.Refusals, 1)
	require.Equal(t, head, got.Refusals[0].TaskID, "the refused row is g1/a's head")
	require.NotNil(t, got.ID)
	require.Equal(t, ids[0], *got.ID, "not the first row of g2/b")

	require.Equal(t, sorts, calls(t, "harvest_pick_fair_sort"), "the step sorted the queue's pending rows")
	require.Equal(t, folds+2, calls(t, "harvest_fair_fold"), "the statement's fold and the step's")
}

// claimStatement is a fair claim statement of queue q taken apart: its
// preamble (the fair lock, the fold) has run in tx, and step runs one
// harvest_claim_step in it, so a test can commit rows in between.
type claimStatement struct {
	b                 *bundle
	tx                pgx.Tx
	now               time.Time
	twoLevel, runtime bool
}

func openClaimStatement(t *testing.T, b *bundle, conn *pgxpool.Conn, now time.Time) *claimStatement {
	t.Helper()
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(b.ctx) })
	st := &claimStatement{b: b, tx: tx, now: now}
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT two_level, runtime FROM harvest_claim_prepare('q', $1, true, false)`,
		now).Scan(&st.twoLevel, &st.runtime))
	return st
}

// stepResult is what one harvest_claim_step answered.
type stepResult struct {
	Outcome  string
	ID       *int64
	Refusals []struct {
		TaskID   int64  `json:"task_id"`
		QuotaKey string `json:"quota_key"`
	}
}

// step runs one claim step as worker w and commits the statement.
func (st *claimStatement) step(t *testing.T) stepResult {
	t.Helper()
	var r stepResult
	require.NoError(t, st.tx.QueryRow(st.b.ctx, `SELECT outcome, id, refusals
		FROM harvest_claim_step('q', 'w', $1, true, 0, interval '1 minute', NULL, $2, $3)`,
		st.now, st.twoLevel, st.runtime).Scan(&r.Outcome, &r.ID, &r.Refusals))
	require.NoError(t, st.tx.Commit(st.b.ctx))
	return r
}
