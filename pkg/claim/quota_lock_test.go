package claim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// Two ordinary batches that meet two quota keys in opposite orders do not
// deadlock on the quota rows. The interleaving that did, with rows b1
// (quota key "b"), r (none) and a1 (quota key "a") in claim order:
//
//	A (2 rows): its first read sees b1 and r; it locks the quota row of
//	   "b", then waits for b's bucket, which the test holds;
//	r is claimed by id meanwhile;
//	B (2 rows): sees b1 and a1; locks the quota row of "a", then waits
//	   for that of "b", held by A;
//	the test lets the bucket go: A reads b1 and a1 and wants the quota
//	   row of "a", held by B.
//
// A must not wait for "a" (it sorts before "b", which A holds): it ends
// its batch with b1, and B, once A commits, takes a1. Each batch runs in a
// transaction of its own making, so a deadlock is not sent again but comes
// back as ErrDeadlock. A claims by bulk steps, or (with ageing) by single
// steps, whose rechecks lock the quota rows one row at a time.
func TestOrdinaryBatchesDoNotDeadlockOnQuotaRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		aging int
	}{{"bulk steps", 0}, {"single steps", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			now := t0.Add(time.Hour)
			b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES
				('q', 'a', 10, NULL, NULL), ('q', 'b', NULL, 1, 10)`)
			b.exec(`INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at) VALUES ('q', 'b', 10, $1)`, now)
			run := b.run(runOpts{})
			b1 := b.task(taskOpts{RunPK: run, QuotaKey: "b", DueAt: t0})
			r := b.task(taskOpts{RunPK: run, DueAt: t0.Add(time.Second)})
			a1 := b.task(taskOpts{RunPK: run, QuotaKey: "a", DueAt: t0.Add(2 * time.Second)})

			begin := func() (pgx.Tx, int32) {
				tx, err := b.db.Begin(b.ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(b.ctx) })
				var pid int32
				require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
				return tx, pid
			}
			// waiting returns once pid waits for a lock (pg_locks is the
			// only signal from inside a statement).
			waiting := func(pid int32, what string) {
				t.Helper()
				give := time.After(time.Minute)
				for {
					var w bool
					require.NoError(t, b.db.QueryRow(b.ctx,
						`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, pid).Scan(&w))
					if w {
						return
					}
					select {
					case <-give:
						t.Fatalf("%s never waited", what)
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
			type out struct {
				got []claim.Result
				err error
			}
			batch := func(tx pgx.Tx, req claim.Request, n int, done chan<- out) {
				got, err := claim.ClaimBatch(b.ctx, tx, req, n)
				if err == nil {
					err = tx.Commit(b.ctx)
				}
				done <- out{got, err}
			}

			txBucket, _ := begin()
			_, err := txBucket.Exec(b.ctx, `SELECT 1 FROM rate_buckets WHERE queue = 'q' AND quota_key = 'b' FOR NO KEY UPDATE`)
			require.NoError(t, err)
			txA, pidA := begin()
			txB, pidB := begin()

			doneA := make(chan out, 1)
			go batch(txA, claim.Request{Queue: "q", Worker: "a", Now: now, AgingSecs: tc.aging}, 2, doneA)
			waiting(pidA, "A, for b's bucket")
			other, err := claim.ClaimByID(b.ctx, b.db, r, claim.Request{Queue: "q", Worker: "o", Now: now})
			require.NoError(t, err)
			require.True(t, other.OK)
			doneB := make(chan out, 1)
			go batch(txB, claim.Request{Queue: "q", Worker: "b", Now: now}, 2, doneB)
			waiting(pidB, "B, for b's quota row")
			require.NoError(t, txBucket.Rollback(b.ctx))

			ids := func(rs []claim.Result) []int64 {
				var out []int64
				for _, r := range rs {
					require.True(t, r.OK)
					out = append(out, r.Task.ID)
				}
				return out
			}
			// Both results first: the victim of a deadlock is either batch.
			outs := map[string]out{}
			for name, done := range map[string]chan out{"A": doneA, "B": doneB} {
				select {
				case o := <-done:
					outs[name] = o
				case <-time.After(time.Minute):
					t.Fatalf("batch %s hangs", name)
				}
			}
			for name, o := range outs {
				require.False(t, errors.Is(o.err, claim.ErrDeadlock), "batch %s deadlocked: %v", name, o.err)
				require.NoError(t, o.err, "batch %s", name)
			}
			require.Equal(t, []int64{b1}, ids(outs["A"].got), "batch A ends before a1")
			require.Equal(t, []int64{a1}, ids(outs["B"].got), "batch B")
			// The bucket lost the one token A's row took, and nothing else
			// was claimed.
			var tokens float64
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT tokens FROM rate_buckets WHERE quota_key = 'b'`).Scan(&tokens))
			require.Equal(t, 9.0, tokens)
			require.Equal(t, []string{"running : 1", "running a: 1", "running b: 1"}, stripBuckets(b.quotaState(t)))
		})
	}
}

// stripBuckets leaves out the bucket lines of a quotaState.
func stripBuckets(state []string) []string {
	var out []string
	for _, s := range state {
		if len(s) < 7 || s[:7] != "bucket " {
			out = append(out, s)
		}
	}
	return out
}
