package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// Starts and claims never wait on each other: a start takes no lock a
// claim needs, a claim none a start needs, and with fairness off the claim
// takes no lock of the fair claim at all. Each test holds one side open in
// a transaction and runs the other; were it to wait, the database would
// show it waiting on the open transaction, which fails the test at once.

// notBlockedBy runs f and fails the test if, before f returns, the
// database shows a statement waiting on a lock held by holder's backend.
func notBlockedBy(t *testing.T, b *bundle, holder pgx.Tx, what string, f func() error) {
	t.Helper()
	var pid int
	require.NoError(t, holder.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	go func() { done <- f() }()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			require.NoError(t, err, what)
			return
		case <-tick.C:
			var waiting int
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND $1 = ANY (pg_blocking_pids(pid))`, pid).Scan(&waiting))
			if waiting > 0 {
				require.NoError(t, holder.Rollback(b.ctx))
				<-done
				t.Fatalf("%s waited for the open transaction", what)
			}
		}
	}
}

// An uncommitted start of a key neither blocks the claims of the queue nor
// hides the key's committed rows: the fair claim takes the key's committed
// row at once, and so does the ordinary claim.
func TestUncommittedStartBlocksAndHidesNothing(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{true, false} {
		t.Run(map[bool]string{true: "fair", false: "ordinary"}[fair], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			committed := b.task(taskOpts{Key: "k"})
			other := b.task(taskOpts{Key: "other"})
			start, err := b.db.Begin(b.ctx)
			require.NoError(t, err)
			defer start.Rollback(b.ctx) //nolint:errcheck
			run := b.run(runOpts{})
			_, err = claim.Enqueue(b.ctx, start, claim.NewTask{RunPK: run, Queue: "q", Key: "k"})
			require.NoError(t, err)

			req := claim.Request{Queue: "q", Worker: "w", Fair: fair}
			var got []int64
			notBlockedBy(t, b, start, "the claims", func() error {
				for range 2 {
					r, err := claim.Claim(b.ctx, b.db, req)
					if err != nil {
						return err
					}
					got = append(got, r.Task.ID)
				}
				return nil
			})
			require.ElementsMatch(t, []int64{committed, other}, got)
			require.NoError(t, start.Commit(b.ctx))
			r := b.claim(req)
			require.True(t, r.OK, "the start, once committed, is claimable")
		})
	}
}

// A fair claim left open (holding the queue's fair lock and its row) does
// not hold back a start of the same key, nor a cancel of another task.
func TestOpenFairClaimBlocksNoStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tasks(2, taskOpts{Key: "k"})
	victim := b.task(taskOpts{Key: "k"})
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	r, err := claim.Claim(b.ctx, tx, claim.Request{Queue: "q", Worker: "w", Fair: true})
	require.NoError(t, err)
	require.True(t, r.OK)

	notBlockedBy(t, b, tx, "a start of the same key", func() error {
		run := b.run(runOpts{})
		_, err := claim.Enqueue(b.ctx, b.db, claim.NewTask{RunPK: run, Queue: "q", Key: "k"})
		return err
	})
	notBlockedBy(t, b, tx, "a group of starts", func() error {
		_, err := b.db.Exec(b.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key)
			SELECT pk, 'q', 'k' FROM runs LIMIT 5`)
		return err
	})
	notBlockedBy(t, b, tx, "a cancel", func() error {
		_, err := b.db.Exec(b.ctx, `UPDATE tasks SET state = 'done' WHERE id = $1`, victim)
		return err
	})
	require.NoError(t, tx.Commit(b.ctx))
}

// With fairness off the claim takes no lock of the fair claim: while an
// ordinary claim's transaction is open, the queue's fair lock is free and
// no fairness state row is locked.
func TestOrdinaryClaimTakesNoFairnessLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	early := time.Now().Add(-time.Hour)
	b.tasks(3, taskOpts{Key: "o", DueAt: early})
	b.tasks(2, taskOpts{Key: "k", DueAt: early.Add(time.Minute)})
	// A fair claim first: o is served and in debt, k has no debt.
	require.Equal(t, "o", b.claim(claim.Request{Queue: "q", Fair: true}).Task.Key)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	r, err := claim.Claim(b.ctx, tx, claim.Request{Queue: "q", Worker: "w"})
	require.NoError(t, err)
	require.Equal(t, "o", r.Task.Key, "the ordinary claim takes the oldest row, whatever its key")

	other, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer other.Rollback(b.ctx) //nolint:errcheck
	var free bool
	require.NoError(t, other.QueryRow(b.ctx,
		`SELECT pg_try_advisory_xact_lock(harvest_queue_lock_key('q'))`).Scan(&free))
	require.True(t, free, "the ordinary claim holds the queue's fair lock")
	_, err = other.Exec(b.ctx, `SELECT * FROM fair_state FOR UPDATE NOWAIT`)
	require.NoError(t, err, "the ordinary claim holds a fairness state row")
	_, err = other.Exec(b.ctx, `SELECT * FROM fair_queues FOR UPDATE NOWAIT`)
	require.NoError(t, err)
	require.NoError(t, other.Rollback(b.ctx))

	// A fair claim of the queue goes on meanwhile (it wants k, which has no
	// debt, not the row the ordinary claim holds).
	notBlockedBy(t, b, tx, "a fair claim", func() error {
		r, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "q", Worker: "w2", Fair: true})
		if err == nil && r.Task.Key != "k" {
			t.Errorf("the fair claim took %q", r.Task.Key)
		}
		return err
	})
	require.NoError(t, tx.Commit(b.ctx))
}

// The claim at its slowest edge: a fair claim whose key's head is the very
// row an open ordinary claim took waits for that claim (both are claims, of
// one row), and then takes the key's next row, never the same one.
func TestFairClaimWaitsForAnOpenClaimOfItsHead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.tasks(2, taskOpts{Key: "k"})
	require.True(t, b.claim(claim.Request{Queue: "q", Fair: true}).OK) // folds the key
	b.tasks(1, taskOpts{Key: "k"})
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	r, err := claim.Claim(b.ctx, tx, claim.Request{Queue: "q", Worker: "w"})
	require.NoError(t, err)
	require.Equal(t, ids[1], r.Task.ID)

	got := make(chan claim.Result, 1)
	go func() {
		r, err := claim.Claim(context.WithoutCancel(b.ctx), b.db, claim.Request{Queue: "q", Worker: "w2", Fair: true})
		require.NoError(t, err)
		got <- r
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n > 0
	}, time.Minute, 2*time.Millisecond)
	require.NoError(t, tx.Commit(b.ctx))
	fair := <-got
	require.True(t, fair.OK)
	require.NotEqual(t, ids[1], fair.Task.ID)
}
