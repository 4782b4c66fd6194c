package claim_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ids(rs []claim.Result) []int64 {
	var out []int64
	for _, r := range rs {
		if r.OK {
			out = append(out, r.Task.ID)
		}
	}
	return out
}

func TestFairClaimServesKeysInTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flood := b.tasks(6, taskOpts{Key: "flood", DueAt: t0})
	late := b.task(taskOpts{Key: "late", DueAt: t0.Add(time.Second)})
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Now: t0.Add(time.Minute)}

	var got []int64
	for range 4 {
		r := b.claim(req)
		require.True(t, r.OK)
		got = append(got, r.Task.ID)
	}
	// flood's first row, then the new key (no debt), then flood again.
	require.Equal(t, []int64{flood[0], late, flood[1], flood[2]}, got)
}

func TestWeightAppliesAtNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.tasks(6, taskOpts{Key: "a", DueAt: t0})
	c := b.tasks(6, taskOpts{Key: "c", DueAt: t0.Add(time.Second)})
	b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'a', 2)`)
	req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Minute)}
	var got []int64
	for range 6 {
		got = append(got, b.claim(req).Task.ID)
	}
	// Weight 2 gets two claims for each of c's.
	require.Equal(t, []int64{a[0], c[0], a[1], a[2], c[1], a[3]}, got)
}

func TestOrdinaryClaimOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	low := b.task(taskOpts{Key: "a", DueAt: t0})
	first := b.task(taskOpts{Key: "b", DueAt: t0.Add(2 * time.Second)})
	cont := b.task(taskOpts{Key: "b", DueAt: t0.Add(3 * time.Second), Continuation: true})
	high := b.task(taskOpts{Key: "c", DueAt: t0.Add(4 * time.Second), Priority: 5})
	sticky := b.task(taskOpts{Key: "c", DueAt: t0.Add(5 * time.Second), Priority: -5,
		StickyWorker: "w1", StickyUntil: t0.Add(time.Hour)})
	req := claim.Request{Queue: "q", Worker: "w1", Now: t0.Add(time.Minute)}
	var got []int64
	for range 6 {
		got = append(got, b.claim(req).Task.ID)
	}
	require.Equal(t, []int64{sticky, high, cont, low, first, 0}, got)
	require.Equal(t, claim.EmptyNoTask, b.claim(req).Empty)
}

func TestAgeingLiftsOldRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.task(taskOpts{DueAt: t0})
	fresh := b.task(taskOpts{DueAt: t0.Add(50 * time.Second), Priority: 1})
	now := t0.Add(60 * time.Second)
	// Without ageing priority wins; with a 30 s period the old row gains 2.
	r := b.claim(claim.Request{Queue: "q", Now: now, AgingSecs: 30})
	require.Equal(t, old, r.Task.ID)
	r = b.claim(claim.Request{Queue: "q", Now: now, AgingSecs: 30, Fair: true})
	require.Equal(t, fresh, r.Task.ID)
}

func TestNotDueRowsDoNotHideDueOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := t0
	// Many rows of a high priority that are not due yet, in front of the
	// one due row in every index order.
	for range 50 {
		b.task(taskOpts{Key: "k", Priority: 10, DueAt: now.Add(time.Hour), Now: now})
	}
	due := b.task(taskOpts{Key: "k", DueAt: now.Add(-time.Second), Now: now})
	for _, fair := range []bool{true, false} {
		r := b.claim(claim.Request{Queue: "q", Fair: fair, Now: now})
		if fair {
			require.True(t, r.OK)
			require.Equal(t, due, r.Task.ID)
		} else {
			require.Equal(t, claim.EmptyNoTask, r.Empty)
		}
	}
	// Once due, the claim itself promotes them.
	r := b.claim(claim.Request{Queue: "q", Fair: true, Now: now.Add(2 * time.Hour)})
	require.True(t, r.OK)
	require.Equal(t, 10, r.Task.Priority)
	n, err := claim.PromoteDue(b.ctx, b.db, "", now.Add(2*time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

func TestRechecksRefuseAndSkipQuotaKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'capped', 1)`)
	b.exec(`INSERT INTO quotas (queue, quota_key, rate, burst) VALUES ('q', 'slow', 1, 1)`)
	c1 := b.task(taskOpts{Key: "a", QuotaKey: "capped", DueAt: t0})
	c2 := b.task(taskOpts{Key: "a", QuotaKey: "capped", DueAt: t0})
	s1 := b.task(taskOpts{Key: "b", QuotaKey: "slow", DueAt: t0})
	s2 := b.task(taskOpts{Key: "b", QuotaKey: "slow", DueAt: t0})
	other := b.task(taskOpts{Key: "c", DueAt: t0.Add(time.Second)})
	req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Minute)}

	require.Equal(t, c1, b.claim(req).Task.ID)
	require.Equal(t, s1, b.claim(req).Task.ID)
	// c has no debt and goes first.
	require.Equal(t, other, b.claim(req).Task.ID)
	// a is at its cap, b's bucket is empty: both refused, in key order.
	r := b.claim(req)
	require.False(t, r.OK)
	require.Equal(t, claim.EmptyRefused, r.Empty)
	require.Equal(t, []claim.Refusal{
		{TaskID: c2, QuotaKey: "capped", Reason: claim.ReasonConcurrencyCap},
		{TaskID: s2, QuotaKey: "slow", Reason: claim.ReasonRateLimit},
	}, r.Refused)
	// Nothing was charged by the refusals, and the rows are still pending.
	require.Equal(t, "pending", b.row(c2).State)
	require.Equal(t, "pending", b.row(s2).State)
	// A second later the bucket has a token again.
	req.Now = req.Now.Add(time.Second)
	require.Equal(t, s2, b.claim(req).Task.ID)
}

func TestClaimByIDChargesKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.task(taskOpts{Key: "k", DueAt: t0})
	req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Second)}
	r, err := claim.ClaimByID(b.ctx, b.db, id, req)
	require.NoError(t, err)
	require.True(t, r.OK)
	rows, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, 1.0, rows[0].Pass)
	r, err = claim.ClaimByID(b.ctx, b.db, id, req)
	require.NoError(t, err)
	require.Equal(t, claim.EmptyNoTask, r.Empty)
}

func TestBatchChargesEachKeyInFairOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.tasks(4, taskOpts{Key: "a", DueAt: t0})
	c := b.tasks(2, taskOpts{Key: "c", DueAt: t0.Add(time.Second)})
	req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Minute)}
	rs, err := claim.ClaimBatch(b.ctx, b.db, req, 5)
	require.NoError(t, err)
	require.Equal(t, []int64{a[0], c[0], a[1], c[1], a[2]}, ids(rs))
	rows, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	require.Equal(t, 3.0, rows[0].Pass) // a charged three times
	require.Equal(t, 2.0, rows[1].Pass) // c twice
}

func TestQueueOrderIsWeightedAndRepeatable(t *testing.T) {
	t.Parallel()
	qs := []claim.QueueWeight{{"big", 3}, {"small", 1}, {"off", 0}}
	first := map[string]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4000 {
		o := claim.QueueOrder(qs, rng)
		require.Len(t, o, 3)
		require.Equal(t, "off", o[2])
		first[o[0]]++
	}
	require.InDelta(t, 3000, first["big"], 150)
	a := claim.QueueOrder(qs, rand.New(rand.NewPCG(7, 7)))
	require.Equal(t, a, claim.QueueOrder(qs, rand.New(rand.NewPCG(7, 7))))
}

func TestClaimQueuesTriesEachQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.task(taskOpts{Queue: "second", DueAt: t0})
	r, err := claim.ClaimQueues(b.ctx, b.db, []claim.QueueWeight{{"first", 100}, {"second", 1}},
		claim.Request{Fair: true, Now: t0}, rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	require.Equal(t, id, r.Task.ID)
}

// leased claims one task of a fresh run and returns it.
func leased(b *bundle, key string) claim.Task {
	b.t.Helper()
	run := b.run(runOpts{MaxAttempts: 5})
	b.task(taskOpts{RunPK: run, Key: key})
	r := b.claim(claim.Request{Queue: "q", Worker: "w1", Fair: true, Lease: time.Minute})
	require.True(b.t, r.OK)
	return r.Task
}

func TestStaleLeaseChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := leased(b, "k")
	// The lease expires, rescue puts the task back, another worker takes it.
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, old.ID)
	n, err := claim.RescueExpired(b.ctx, b.db, 0)
	require.NoError(t, err)
	require.Equal(t, claim.Rescued{Requeued: 1}, n)
	r := b.claim(claim.Request{Queue: "q", Worker: "w2", Fair: true, Lease: time.Minute})
	require.True(t, r.OK)
	require.Equal(t, old.ID, r.Task.ID)
	require.Equal(t, 2, r.Task.Attempt)
	before := b.row(old.ID)
	stateBefore, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)

	err = claim.Complete(b.ctx, b.db, old.ID, old.LeaseToken, json.RawMessage(`{"x":1}`))
	require.ErrorIs(t, err, claim.ErrStaleLease)
	_, err = claim.Fail(b.ctx, b.db, old.ID, old.LeaseToken, claim.FailOptions{Error: "boom"})
	require.ErrorIs(t, err, claim.ErrStaleLease)
	_, err = claim.Fail(b.ctx, b.db, old.ID, old.LeaseToken, claim.FailOptions{Error: "boom", RetryAfter: time.Second})
	require.ErrorIs(t, err, claim.ErrStaleLease)
	_, err = claim.Heartbeat(b.ctx, b.db, old.ID, old.LeaseToken, time.Hour)
	require.ErrorIs(t, err, claim.ErrStaleLease)
	_, err = claim.Continue(b.ctx, b.db, old.ID, old.LeaseToken, claim.ContinueOptions{StickyFor: time.Minute})
	require.ErrorIs(t, err, claim.ErrStaleLease)

	require.Equal(t, before, b.row(old.ID))
	stateAfter, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	require.Equal(t, stateBefore, stateAfter)
	var tasks int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks`).Scan(&tasks))
	require.Equal(t, 1, tasks)

	_, err = claim.Heartbeat(b.ctx, b.db, 999999, uuid.New(), time.Hour)
	require.ErrorIs(t, err, claim.ErrNotFound)
	// The current token still works.
	require.NoError(t, claim.Complete(b.ctx, b.db, old.ID, r.Task.LeaseToken, nil))
	require.Equal(t, "completed", b.row(old.ID).RunState)
}

func TestLeaseLifeCycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := leased(b, "k")
	until, err := claim.Heartbeat(b.ctx, b.db, task.ID, task.LeaseToken, time.Hour)
	require.NoError(t, err)
	require.True(t, until.After(task.LeaseExpiresAt))

	next, err := claim.Continue(b.ctx, b.db, task.ID, task.LeaseToken, claim.ContinueOptions{
		Input: json.RawMessage(`{"step":2}`), StickyFor: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "done", b.row(task.ID).State)
	// A first task of another run, due earlier, still loses to the
	// continuation at equal lag: both keys are fresh here.
	r := b.claim(claim.Request{Queue: "q", Worker: "w1", Fair: true})
	require.Equal(t, next, r.Task.ID)
	require.True(t, r.Task.Continuation)
	require.Equal(t, 1, r.Task.Step)
	require.Equal(t, "w1", r.Task.StickyWorker)

	retried, err := claim.Fail(b.ctx, b.db, r.Task.ID, r.Task.LeaseToken, claim.FailOptions{Error: "e", RetryAfter: time.Hour})
	require.NoError(t, err)
	require.True(t, retried)
	require.Equal(t, "scheduled", b.row(r.Task.ID).State)
	require.Equal(t, "queued", b.row(r.Task.ID).RunState)

	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, 1, running)
	r2 := b.claim(claim.Request{Queue: "q", Worker: "w1", Fair: true, Now: time.Now().Add(2 * time.Hour)})
	require.Equal(t, r.Task.ID, r2.Task.ID)
	retried, err = claim.Fail(b.ctx, b.db, r2.Task.ID, r2.Task.LeaseToken, claim.FailOptions{Error: "final"})
	require.NoError(t, err)
	require.False(t, retried)
	row := b.row(r2.Task.ID)
	require.Equal(t, "done", row.State)
	require.Equal(t, "failed", row.RunState)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, 0, running)
}

func TestRescueNeverRevertsFinishedTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := leased(b, "k")
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, task.ID)
	// Complete and rescue race: run them concurrently many times over
	// fresh tasks; a completed task must stay done.
	require.NoError(t, claim.Complete(b.ctx, b.db, task.ID, task.LeaseToken, nil))
	n, err := claim.RescueExpired(b.ctx, b.db, 0)
	require.NoError(t, err)
	require.Equal(t, claim.Rescued{}, n)
	require.Equal(t, "done", b.row(task.ID).State)

	for range 20 {
		tk := leased(b, "k")
		b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, tk.ID)
		var wg sync.WaitGroup
		var cerr error
		wg.Go(func() { cerr = claim.Complete(b.ctx, b.db, tk.ID, tk.LeaseToken, nil) })
		wg.Go(func() { _, _ = claim.RescueExpired(b.ctx, b.db, 0) })
		wg.Wait()
		row := b.row(tk.ID)
		if cerr == nil {
			require.Equal(t, "done", row.State)
			require.Equal(t, "completed", row.RunState)
		} else {
			require.ErrorIs(t, cerr, claim.ErrStaleLease)
			require.Equal(t, "pending", row.State)
		}
		if row.State == "pending" {
			r := b.claim(claim.Request{Queue: "q", Fair: true})
			require.NoError(t, claim.Complete(b.ctx, b.db, r.Task.ID, r.Task.LeaseToken, nil))
		}
	}
}

func TestRescueFailsRunAtMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.run(runOpts{MaxAttempts: 1})
	id := b.task(taskOpts{RunPK: run})
	r := b.claim(claim.Request{Queue: "q", Fair: true})
	require.Equal(t, id, r.Task.ID)
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, id)
	n, err := claim.RescueExpired(b.ctx, b.db, 0)
	require.NoError(t, err)
	require.Equal(t, claim.Rescued{Failed: 1}, n)
	require.Equal(t, "failed", b.row(id).RunState)
}

func TestPrunePreviewMatchesAndLocksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		b.task(taskOpts{Key: k, DueAt: t0})
	}
	b.task(taskOpts{Key: "e", DueAt: t0})
	req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Second)}
	for range 4 {
		require.True(t, b.claim(req).OK)
	}
	b.task(taskOpts{Queue: "idle", Key: "z", DueAt: t0})
	require.True(t, b.claim(claim.Request{Queue: "idle", Fair: true, Now: t0.Add(time.Second)}).OK)

	// Hold a lock on every real state row while previewing.
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	_, err = tx.Exec(b.ctx, `SELECT * FROM fair_state FOR UPDATE`)
	require.NoError(t, err)
	now := t0.Add(time.Hour)
	preview, err := claim.PruneFairState(b.ctx, b.db, now, time.Minute, true)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(b.ctx))

	// a..c go; d is the clock row; e still has work (and no row); the idle
	// queue loses everything.
	want := []claim.StateKey{{Queue: "idle", Key: "z"}, {Queue: "q", Key: "a"}, {Queue: "q", Key: "b"}, {Queue: "q", Key: "c"}}
	require.Equal(t, want, preview)
	got, err := claim.PruneFairState(b.ctx, b.db, now, time.Minute, false)
	require.NoError(t, err)
	require.Equal(t, want, got)
	again, err := claim.PruneFairState(b.ctx, b.db, now, time.Minute, false)
	require.NoError(t, err)
	require.Empty(t, again)
}

func TestPruneUsesDatabaseClockWhenNowIsZero(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := time.Now().Add(-3 * time.Hour)
	b.task(taskOpts{Key: "a", DueAt: long, Now: long})
	require.True(t, b.claim(claim.Request{Queue: "q", Fair: true, Now: long.Add(time.Minute)}).OK)
	for _, preview := range []bool{true, false} {
		got, err := claim.PruneFairState(b.ctx, b.db, time.Time{}, time.Hour, preview)
		require.NoError(t, err)
		require.Equal(t, []claim.StateKey{{Queue: "q", Key: "a"}}, got, "preview %v", preview)
	}
}

// A debt mark that the clock has already passed (a repair or a hand edit
// can leave one) must not change the order of keys without debt: they
// compete by their heads. Two such keys, whose passes are in the opposite
// order of their heads, would otherwise come in pass order.
func TestStaleDebtMarkDoesNotReorderKeysWithoutDebt(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("batch=%d", n), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, k := range []string{"a", "b", "d"} {
				b.task(taskOpts{Key: k, DueAt: t0})
			}
			req := claim.Request{Queue: "q", Fair: true, Now: t0.Add(time.Minute)}
			for range 3 {
				require.True(t, b.claim(req).OK)
			}
			b.task(taskOpts{Key: "d", DueAt: t0})
			require.Equal(t, "d", b.claim(req).Task.Key) // the clock moves to 1
			// Heads: b first, then a.
			b.task(taskOpts{Key: "b", DueAt: t0.Add(time.Second)})
			b.task(taskOpts{Key: "a", DueAt: t0.Add(2 * time.Second)})
			// Both have no debt (pass <= V = 1) but are marked, a with the
			// smaller pass.
			b.exec(`UPDATE fair_state SET in_debt = true, pass = CASE key WHEN 'a' THEN 0.5 ELSE 1 END
				WHERE queue = 'q' AND key IN ('a', 'b')`)
			var got []string
			if n == 1 {
				for range 2 {
					got = append(got, b.claim(req).Task.Key)
				}
			} else {
				rs, err := claim.ClaimBatch(b.ctx, b.db, req, n)
				require.NoError(t, err)
				for _, r := range rs {
					got = append(got, r.Task.Key)
				}
			}
			require.Equal(t, []string{"b", "a"}, got)
		})
	}
}
