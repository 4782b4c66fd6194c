package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// The SQL claim follows the model when things happen at once, not only one
// after the other: a claim transaction is left open while starts, cancels
// and completions commit and while a second claim runs (which has to wait
// for the first when both are fair claims of the queue, or when it wants
// the row the first holds). Every such history must equal the model's
// single claims in the order the claims took effect: the first claim at
// its statement, the writes at their commits, the second claim after them
// and, when it had to wait, after the first one committed.
//
// Half of the runs use the database clock (no Now in the requests), as the
// worker does; those runs keep due times and sticky windows an hour or more
// from the present, use no rate limits, ageing or prune, and compare the
// fairness state without its charge times, which only the database knows.

type interleaveMachine struct {
	*modelMachine
	dbClock bool
	// open is the claim transaction left open, while it is.
	open pgx.Tx
}

func (im *interleaveMachine) now() time.Time {
	if im.dbClock {
		return time.Now().UTC()
	}
	return im.now0()
}

func (im *interleaveMachine) now0() time.Time { return im.modelMachine.now }

func (im *interleaveMachine) request(t *rapid.T) (fairkeys.ClaimRequest, claim.Request) {
	mreq := im.modelMachine.request(t)
	if im.dbClock {
		mreq.AgingSecs = 0
		mreq.Now = im.now()
	}
	sreq := sqlRequest(mreq)
	if im.dbClock {
		sreq.Now = time.Time{}
	}
	return mreq, sreq
}

// insert adds a task; with the database clock, its due time is an hour or
// more in the past and its sticky window an hour away from now either way.
func (im *interleaveMachine) insert(t *rapid.T) {
	if !im.dbClock {
		im.modelMachine.insert(t)
		return
	}
	mm := im.modelMachine
	now := im.now()
	task := fairkeys.Task{
		Queue:        rapid.SampledFrom(mQueues).Draw(t, "queue"),
		Key:          rapid.SampledFrom(mKeys).Draw(t, "key"),
		QuotaKey:     rapid.SampledFrom(mQuotaKeys).Draw(t, "quota"),
		Priority:     rapid.IntRange(-1, 2).Draw(t, "prio"),
		Continuation: rapid.Bool().Draw(t, "cont"),
		DueAt:        now.Add(-time.Hour - time.Duration(rapid.IntRange(0, 60).Draw(t, "age"))*time.Second).Truncate(time.Second),
	}
	if rapid.IntRange(0, 3).Draw(t, "sticky?") == 0 {
		task.StickyWorker = rapid.SampledFrom(mWorkers[1:]).Draw(t, "stickyWorker")
		task.StickyUntil = now.Add(rapid.SampledFrom([]time.Duration{-time.Hour, time.Hour}).Draw(t, "stickyFor"))
	}
	id := mm.b.task(taskOpts{RunPK: mm.run, Queue: task.Queue, Key: task.Key, QuotaKey: task.QuotaKey,
		Priority: task.Priority, Continuation: task.Continuation, DueAt: task.DueAt,
		StickyWorker: task.StickyWorker, StickyUntil: task.StickyUntil})
	task.ID = id
	mm.maxID = max(mm.maxID, id)
	mm.m.Insert(task)
}

// cancel takes one task out of play as a cancelled run does, in a
// transaction of its own.
func (im *interleaveMachine) cancel(t *rapid.T) {
	mm := im.modelMachine
	if mm.maxID == 0 {
		return
	}
	id := rapid.Int64Range(1, mm.maxID).Draw(t, "cancel")
	im.unblocked(t, func() error {
		_, err := mm.b.db.Exec(context.WithoutCancel(mm.b.ctx), `UPDATE tasks
			SET state = 'done', lease_token = NULL, lease_expires_at = NULL
			WHERE id = $1 AND state <> 'done'`, id)
		return err
	})
	mm.ended(t, []int64{id}, mm.m.CancelHeld)
	delete(mm.tokens, id)
}

// write is one write that commits while a claim is open.
func (im *interleaveMachine) write(t *rapid.T) {
	switch rapid.IntRange(0, 2).Draw(t, "write") {
	case 0:
		im.insert(t)
	case 1:
		im.cancel(t)
	case 2:
		mm := im.modelMachine
		if id, ok := mm.running(t); ok {
			im.unblocked(t, func() error {
				return claim.Complete(context.WithoutCancel(mm.b.ctx), mm.b.db, id, mm.tokens[id], nil)
			})
			delete(mm.tokens, id)
			mm.ended(t, []int64{id}, mm.m.CompleteHeld)
		}
	}
}

// unblocked runs f. Should it wait for a lock while a claim transaction is
// open (the open claim holds the row, or the queue's fair lock), the open
// transaction commits and f goes on: f then takes effect after that claim,
// which the model already has before it.
func (im *interleaveMachine) unblocked(t *rapid.T, f func() error) {
	done := make(chan error, 1)
	go func() { done <- f() }()
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		default:
		}
		if im.open != nil && im.waiting(t) {
			require.NoError(t, im.open.Commit(im.b.ctx))
			im.open = nil
		}
		time.Sleep(time.Millisecond)
	}
}

func nullTimeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// waiting reports whether some statement of the test's database waits for
// a lock.
func (im *interleaveMachine) waiting(t *rapid.T) bool {
	var n int
	require.NoError(t, im.b.db.QueryRow(im.b.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
	return n > 0
}

// interleaved leaves one claim open while writes commit and a second claim
// runs, and checks both against the model in the order they took effect.
func (im *interleaveMachine) interleaved(t *rapid.T) {
	mm := im.modelMachine
	b := mm.b
	mreq1, sreq1 := im.request(t)
	// A claim first promotes the due scheduled rows of its queue, in its
	// own transaction: until it commits, other claims see them scheduled.
	var promotes bool
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM tasks
		WHERE queue = $1 AND state = 'scheduled' AND due_at <= coalesce($2, now()))`,
		sreq1.Queue, nullTimeArg(sreq1.Now)).Scan(&promotes))
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	got1, err := claim.Claim(b.ctx, tx, sreq1)
	require.NoError(t, err)
	mm.compare(t, fmt.Sprintf("open claim %+v", mreq1), mm.m.Claim(mreq1), got1)
	im.open = tx
	defer func() {
		if im.open != nil {
			_ = im.open.Commit(b.ctx)
			im.open = nil
		}
	}()

	for range rapid.IntRange(0, 3).Draw(t, "writes") {
		im.write(t)
	}

	if rapid.Bool().Draw(t, "second claim") {
		mreq2, sreq2 := im.request(t)
		if im.open != nil && sreq2.Queue == sreq1.Queue &&
			(promotes || len(got1.Refused) > 0 || (!sreq2.Fair && got1.OK && got1.Task.QuotaKey != "")) {
			// Rows the open claim promoted are pending only once it commits,
			// and rows its rechecks gave back stay locked until then, which
			// an ordinary claim skips, and so does a fair claim's pick of the
			// rows pinned to its worker (a pin is a preference, not worth a
			// wait): the second claim would not see them, which no sequence
			// of single claims gives. And the open claim holds the quota row
			// of the row it took until it commits: an ordinary claim that
			// meets that quota key after a later one (out of the quota rows'
			// lock order) does not wait for it but ends there, as if no row
			// were left ('busy', harvest_quota_recheck), which no sequence
			// of single claims gives either. Let the first claim commit
			// first.
			require.NoError(t, im.open.Commit(b.ctx))
			im.open = nil
		}
		// A single claim, or a batch (planned at once, which reads more
		// before it locks anything).
		n := 1
		if !im.dbClock {
			n = rapid.SampledFrom([]int{1, 1, 2, 5}).Draw(t, "second n")
		}
		var got2 []claim.Result
		waited := im.open != nil
		im.unblocked(t, func() error {
			ctx := context.WithoutCancel(b.ctx)
			if n == 1 {
				r, err := claim.Claim(ctx, b.db, sreq2)
				got2 = []claim.Result{r}
				return err
			}
			var err error
			got2, err = claim.ClaimBatch(ctx, b.db, sreq2, n)
			return err
		})
		waited = waited && im.open == nil
		if waited {
			interleaveStats.waited++
		} else if im.open != nil {
			interleaveStats.concurrent++
		}
		what := fmt.Sprintf("second claim of %d %+v (waited %v)", n, mreq2, waited)
		if n == 1 {
			mm.compare(t, what, mm.m.Claim(mreq2), got2[0])
			return
		}
		var want []fairkeys.ClaimResult
		for range n {
			r := mm.m.Claim(mreq2)
			if !r.OK {
				if r.Empty == claim.EmptyRefused {
					want = append(want, r)
				}
				break
			}
			want = append(want, r)
		}
		if len(got2) != len(want) {
			t.Fatalf("%s: model gave %d results, sql %d", what, len(want), len(got2))
		}
		for i := range want {
			mm.compare(t, fmt.Sprintf("%s, result %d", what, i+1), want[i], got2[i])
		}
	}
}

func (im *interleaveMachine) actions() map[string]func(*rapid.T) {
	acts := im.modelMachine.actions()
	b := im.b
	acts["insert"] = im.insert
	acts["insert more"] = im.insert
	acts["cancel"] = im.cancel
	acts["interleaved"] = im.interleaved
	acts["interleaved again"] = im.interleaved
	acts["claim"] = func(t *rapid.T) {
		mreq, sreq := im.request(t)
		got, err := claim.Claim(b.ctx, b.db, sreq)
		require.NoError(t, err)
		im.compare(t, fmt.Sprintf("claim %+v", mreq), im.m.Claim(mreq), got)
	}
	if im.dbClock {
		// Operations whose outcome depends on the time in ways only the
		// database knows are left out.
		for _, name := range []string{"claimByID", "claimBatch", "claimBatchPinned", "insertPinned", "requeue", "setQuota", "prune", "advance"} {
			delete(acts, name)
		}
		acts["setCap"] = func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			qk := rapid.SampledFrom(mQuotaKeys[1:]).Draw(t, "quota")
			limit := rapid.IntRange(1, 2).Draw(t, "cap")
			b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ($1, $2, $3)
				ON CONFLICT (queue, quota_key) DO UPDATE SET max_concurrent = EXCLUDED.max_concurrent, rate = NULL, burst = NULL`,
				q, qk, limit)
			im.m.SetQuota(q, qk, fairkeys.Quota{MaxConcurrent: limit})
		}
		acts[""] = func(t *rapid.T) {
			rows, err := claim.FairState(b.ctx, b.db)
			require.NoError(t, err)
			got := map[fairkeys.StateKey][2]float64{}
			for _, r := range rows {
				got[fairkeys.StateKey{Queue: r.Queue, Key: r.Key}] = [2]float64{r.Pass, r.LastStart}
			}
			want := map[fairkeys.StateKey][2]float64{}
			for _, q := range mQueues {
				for _, k := range mKeys {
					if s, ok := im.m.State(q, k); ok {
						want[fairkeys.StateKey{Queue: q, Key: k}] = [2]float64{s.Pass, s.LastStart}
					}
				}
			}
			require.Equal(t, want, got)
		}
	}
	return acts
}

// interleaveStats shows in -v output that the runs reach the cases that
// matter: second claims that had to wait for the open one, and second
// claims that ran while it was still open.
var interleaveStats struct{ waited, concurrent, dbClock int }

func TestSQLFollowsModelWithInterleavings(t *testing.T) {
	t.Parallel()
	rapidSteps(t)
	b := setup(t)
	rapid.Check(t, func(rt *rapid.T) {
		b.exec(`TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, weight_overrides,
			weight_override_counts, quotas, rate_buckets, tenant_running, queue_fairness, group_weights, fair_groups,
			fair_held RESTART IDENTITY`)
		mm := &modelMachine{stats: &modelStats{}, b: b, m: fairkeys.NewModel(), now: t0, tokens: map[int64]uuid.UUID{}}
		mm.run = b.run(runOpts{MaxAttempts: 1_000_000})
		im := &interleaveMachine{modelMachine: mm, dbClock: rapid.Bool().Draw(rt, "database clock")}
		if im.dbClock {
			interleaveStats.dbClock++
		}
		rt.Repeat(im.actions())
	})
	t.Logf("second claims that waited for the open one %d, ran beside it %d; runs on the database clock %d",
		interleaveStats.waited, interleaveStats.concurrent, interleaveStats.dbClock)
}
