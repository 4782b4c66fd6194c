package claim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// heldRow is one settlement waiting in fair_held.
type heldRow struct {
	Task   int64
	Secs   float64
	Billed float64
}

func (b *bundle) held(queue string) []heldRow {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT task_id, secs, billed FROM fair_held WHERE queue = $1 ORDER BY id`, queue)
	require.NoError(b.t, err)
	var out []heldRow
	for rows.Next() {
		var h heldRow
		require.NoError(b.t, rows.Scan(&h.Task, &h.Secs, &h.Billed))
		out = append(out, h)
	}
	require.NoError(b.t, rows.Err())
	return out
}

// In a queue charged by runtime every attempt's worker time is settled
// exactly once, whichever way it ends: completed, failed and retried, or
// rescued after its worker died (billed the lease it held, not more, and a
// late completion of the rescued attempt adds nothing). The next fair
// claim folds the time into the key: its pass moves by held - billed.
func TestRuntimeChargeSettlesEachAttemptOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT harvest_queue_fairness_set('q', NULL, 'runtime', 'test')`)
	run := b.run(runOpts{MaxAttempts: 10})
	for range 4 {
		b.task(taskOpts{RunPK: run, Queue: "q", Key: "a"})
	}
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour}

	done := b.claim(req)
	retried := b.claim(req)
	require.True(t, done.OK && retried.OK)
	var billed float64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT charged_secs FROM tasks WHERE id = $1`, done.Task.ID).Scan(&billed))
	require.Equal(t, 1.0, billed, "a key's first claims bill the default estimate")

	require.NoError(t, claim.Complete(b.ctx, b.db, done.Task.ID, done.Task.LeaseToken, nil))
	ok, err := claim.Fail(b.ctx, b.db, retried.Task.ID, retried.Task.LeaseToken, claim.FailOptions{Error: "x", RetryAfter: time.Millisecond})
	require.NoError(t, err)
	require.True(t, ok, "retried")

	held := b.held("q")
	require.Len(t, held, 2, "one row per ended attempt: %+v", held)
	require.Equal(t, []int64{done.Task.ID, retried.Task.ID}, []int64{held[0].Task, held[1].Task})
	for _, h := range held {
		require.Equal(t, 1.0, h.Billed)
		require.GreaterOrEqual(t, h.Secs, 0.0)
	}

	// A fair claim settles them first, under the queue's lock: pass moves
	// by sum(held - billed), and the estimate becomes their mean.
	var before float64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pass FROM fair_state WHERE queue = 'q' AND key = 'a'`).Scan(&before))
	delta := (held[0].Secs - held[0].Billed) + (held[1].Secs - held[1].Billed)
	var pass, est float64
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT harvest_queue_lock('q')`)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT harvest_fair_held_fold('q', false)`)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pass, held_est FROM fair_state WHERE queue = 'q' AND key = 'a'`).Scan(&pass, &est))
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, before+delta, pass)
	require.Equal(t, (held[0].Secs+held[1].Secs)/2, est, "the first estimate is the mean held time")
	require.Empty(t, b.held("q"), "settled once")

	// A worker that dies: the claim bills the estimate, the lease runs out
	// and the rescue puts the task back, billing the lease it held.
	short := req
	short.Lease = 20 * time.Millisecond
	dead := b.claim(short)
	require.True(t, dead.OK)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT charged_secs FROM tasks WHERE id = $1`, dead.Task.ID).Scan(&billed))
	require.Equal(t, est, billed, "a claim bills the key's estimate")
	var leaseSecs float64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT harvest_secs(harvest_us(lease_expires_at, claimed_at)) FROM tasks WHERE id = $1`,
		dead.Task.ID).Scan(&leaseSecs))
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT lease_expires_at < now() FROM tasks WHERE id = $1`, dead.Task.ID).Scan(&expired))
		return expired
	}, time.Minute, 5*time.Millisecond)
	res, err := claim.RescueExpired(b.ctx, b.db, 10)
	require.NoError(t, err)
	require.Equal(t, 1, res.Requeued)
	require.ErrorIs(t, claim.Complete(b.ctx, b.db, dead.Task.ID, dead.Task.LeaseToken, nil), claim.ErrStaleLease,
		"the dead worker's late completion")
	held = b.held("q")
	require.Equal(t, []heldRow{{Task: dead.Task.ID, Secs: leaseSecs, Billed: est}}, held,
		"a rescued attempt is billed exactly its lease, once")
}

// A queue charged per claim (the default) writes no settlement and bills
// nothing on the task row: runtime charging costs it nothing.
func TestClaimChargeWritesNoSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.run(runOpts{})
	b.task(taskOpts{RunPK: run, Queue: "q", Key: "a"})
	got := b.claim(claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour})
	require.True(t, got.OK)
	var billed *float64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT charged_secs FROM tasks WHERE id = $1`, got.Task.ID).Scan(&billed))
	require.Nil(t, billed)
	require.NoError(t, claim.Complete(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, nil))
	require.Empty(t, b.held("q"))
}
