package claim_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/claim"
)

// keySummary is a key's summary row as stored.
type keySummary struct {
	Key    string
	HeadID *int64
	InDebt bool
}

func (b *bundle) summaries() []keySummary {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT key, head_id, in_debt FROM fair_state ORDER BY queue, key`)
	require.NoError(b.t, err)
	defer rows.Close()
	var out []keySummary
	for rows.Next() {
		var s keySummary
		require.NoError(b.t, rows.Scan(&s.Key, &s.HeadID, &s.InDebt))
		out = append(out, s)
	}
	require.NoError(b.t, rows.Err())
	return out
}

// A batch whose rows all come from one key (the flood shape) is taken in
// bulk; it must leave what the same number of single claims leave: the same
// rows in the same order, the same lags, charges, summaries and leases.
func TestBulkBatchMatchesSingleClaims(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			t.Parallel()
			single, batch := setup(t), setup(t)
			for _, b := range []*bundle{single, batch} {
				b.tasks(3, taskOpts{Key: "light", DueAt: t0})
				b.tasks(12, taskOpts{Key: "flood", DueAt: t0.Add(time.Second)})
				b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'flood', 3)`)
			}
			// Drain the light key first so that the flood is the only key
			// with work (the bulk shape), then take it in two batches.
			req := claim.Request{Queue: "q", Worker: "w", Fair: fair, Lease: time.Minute}
			var want, got []claim.Result
			for range 15 {
				want = append(want, single.claim(req))
			}
			for _, n := range []int{5, 7, 6} {
				rs, err := claim.ClaimBatch(batch.ctx, batch.db, req, n)
				require.NoError(t, err)
				got = append(got, rs...)
			}
			require.Len(t, got, 15)
			for i := range want {
				require.True(t, got[i].OK, i)
				require.Equal(t, want[i].Task.ID, got[i].Task.ID, "row %d", i)
				require.Equal(t, want[i].Lag, got[i].Lag, "lag of row %d", i)
				require.Equal(t, want[i].Task.Attempt, got[i].Task.Attempt)
				require.NotEqual(t, uuid.Nil, got[i].Task.LeaseToken)
				require.Equal(t, "running", batch.row(got[i].Task.ID).RunState)
			}
			ws, err := claim.FairState(single.ctx, single.db)
			require.NoError(t, err)
			gs, err := claim.FairState(batch.ctx, batch.db)
			require.NoError(t, err)
			for i := range ws {
				ws[i].ChargedAt, gs[i].ChargedAt = time.Time{}, time.Time{}
			}
			require.Equal(t, ws, gs)
			require.Equal(t, single.summaries(), batch.summaries())
			rs, err := claim.ClaimBatch(batch.ctx, batch.db, req, 4)
			require.NoError(t, err)
			require.Empty(t, rs)
		})
	}
}

// A batch stops its bulk step before a row with a quota key, so that row
// still goes through the rechecks.
func TestBulkBatchLeavesQuotaRowsToRechecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.tasks(2, taskOpts{Key: "k", DueAt: t0})
	capped := b.tasks(2, taskOpts{Key: "k", QuotaKey: "cap", DueAt: t0.Add(time.Second)})
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'cap', 1)`)
	rs, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "q", Fair: true}, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{a[0], a[1], capped[0]}, ids(rs))
	last := rs[len(rs)-1]
	require.False(t, last.OK)
	require.Equal(t, claim.EmptyRefused, last.Empty)
	require.Equal(t, capped[1], last.Refused[0].TaskID)
}

// Every completion of a batch is fenced by its own token: stale and unknown
// ones change nothing and do not stop the others.
func TestCompleteBatchFencesEachLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := leased(b, "k")
	good2 := leased(b, "k")
	old := leased(b, "k")
	// old's lease expires and another worker takes it again.
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, old.ID)
	_, err := claim.RescueExpired(b.ctx, b.db, 0)
	require.NoError(t, err)
	again := b.claim(claim.Request{Queue: "q", Worker: "w2", Fair: true, Lease: time.Minute})
	require.Equal(t, old.ID, again.Task.ID)
	beforeOld := b.row(old.ID)
	stateBefore, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	var runningBefore int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&runningBefore))

	errs, err := claim.CompleteBatch(b.ctx, b.db, []claim.Completion{
		{ID: good.ID, Token: good.LeaseToken, Output: json.RawMessage(`{"n":1}`)},
		{ID: old.ID, Token: old.LeaseToken, Output: json.RawMessage(`{"n":2}`)},
		{ID: 1 << 40, Token: uuid.New()},
		{ID: good2.ID, Token: good2.LeaseToken},
	})
	require.NoError(t, err)
	require.Len(t, errs, 4)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], claim.ErrStaleLease)
	require.ErrorIs(t, errs[2], claim.ErrNotFound)
	require.NoError(t, errs[3])

	require.Equal(t, beforeOld, b.row(old.ID), "the stale completion changed the task")
	require.Equal(t, "done", b.row(good.ID).State)
	require.Equal(t, "completed", b.row(good.ID).RunState)
	require.Equal(t, "completed", b.row(good2.ID).RunState)
	var out string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT r.output::text FROM runs r JOIN tasks t ON t.run_pk = r.pk WHERE t.id = $1`, good.ID).Scan(&out))
	require.JSONEq(t, `{"n":1}`, out)
	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, runningBefore-2, running)
	stateAfter, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	require.Equal(t, stateBefore, stateAfter)

	// The current holder still completes; the first two are not done twice.
	errs, err = claim.CompleteBatch(b.ctx, b.db, []claim.Completion{
		{ID: old.ID, Token: again.Task.LeaseToken},
		{ID: good.ID, Token: good.LeaseToken},
	})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], claim.ErrStaleLease)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, runningBefore-3, running)
}

// A fair batch over many keys is planned at once (harvest_claim_bulk_fair):
// for random backlogs (keys with and without debt, weights, priorities,
// continuations, quota keys, rows pinned to the claiming worker or to
// another) a batch of n must give exactly what n single claims give on a
// twin database: the same rows in the same order, the same lags, charges,
// clock, heads and debt marks. The test also checks that the plan was used,
// not only the single claim it falls back to, and that batches which began
// with pinned rows went on in bulk.
func TestFairBulkPlanMatchesSingleClaims(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	conn, calls := plCalls(t, batch)
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Now: t0.Add(time.Hour), Lease: time.Minute}
	// The bulk plans this session made so far.
	bulkCalls := func(t require.TestingT) int { return calls(t, "harvest_claim_bulk_fair") }
	// Pinned rows taken by sticky steps (harvest_claim_bulk_sticky) rather
	// than single steps: the pinned rows a batch took, less its single
	// steps.
	stepCalls := func(t require.TestingT) int { return calls(t, "harvest_claim_step") }
	var pinnedThenBulk, refusedInBatch, stickyMany int

	rapid.Check(t, func(rt *rapid.T) {
		for _, b := range []*bundle{single, batch} {
			b.exec(`TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, weight_overrides,
				weight_override_counts, quotas, rate_buckets, tenant_running RESTART IDENTITY`)
		}
		keys := rapid.IntRange(1, 12).Draw(rt, "keys")
		// One row in eight pinned, or one in two: batches that begin with
		// several pinned rows of several keys.
		pinEvery := rapid.SampledFrom([]int{8, 2}).Draw(rt, "pin every")
		run := []int64{single.run(runOpts{MaxAttempts: 100}), batch.run(runOpts{MaxAttempts: 100})}
		type row struct {
			key, quota string
			prio       int
			cont       bool
			due        time.Time
			pin        string
			pinUntil   time.Time
		}
		var rows []row
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			if k == 0 && rapid.Bool().Draw(rt, "default key") {
				key = ""
			}
			if key != "" && rapid.Bool().Draw(rt, "override") {
				w := rapid.SampledFrom([]float64{0.5, 2, 3, 10}).Draw(rt, "weight")
				for _, b := range []*bundle{single, batch} {
					b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', $1, $2)`, key, w)
				}
			}
			for range rapid.IntRange(0, 15).Draw(rt, "rows") {
				r := row{key: key, due: t0.Add(time.Duration(rapid.IntRange(0, 60).Draw(rt, "due")) * time.Second)}
				if rapid.IntRange(0, 3).Draw(rt, "prio") == 0 {
					r.prio = 1
				}
				r.cont = rapid.IntRange(0, 9).Draw(rt, "cont") == 0
				switch rapid.IntRange(0, 9).Draw(rt, "quota") {
				case 0:
					r.quota = "x"
				case 1:
					r.quota = "y"
				}
				// Rows pinned to the claiming worker (the batch takes them
				// first, by sticky or single steps, then goes on in bulk), to another
				// worker, or pinned once (the pin ran out).
				if rapid.IntRange(0, pinEvery-1).Draw(rt, "pinned") == 0 {
					r.pin = rapid.SampledFrom([]string{"w", "w", "v"}).Draw(rt, "pin")
					r.pinUntil = req.Now.Add(time.Duration(rapid.IntRange(-2, 8).Draw(rt, "pin for")) * time.Minute)
				}
				rows = append(rows, r)
			}
		}
		// Quotas on the quota keys, or none: the bulk step applies their
		// rechecks as the single claims would.
		for _, qk := range []string{"x", "y"} {
			drawQuota(rt, []*bundle{single, batch}, qk, 4, 0)
		}
		// Insert in a shuffled order, so ids do not follow keys.
		order := rapid.Permutation(rows).Draw(rt, "order")
		for _, r := range order {
			for i, b := range []*bundle{single, batch} {
				b.task(taskOpts{RunPK: run[i], Key: r.key, QuotaKey: r.quota, Priority: r.prio,
					Continuation: r.cont, DueAt: r.due, StickyWorker: r.pin, StickyUntil: r.pinUntil,
					Now: t0.Add(time.Hour)})
			}
		}
		// Some claims first, so that keys carry debt and the clock moved.
		for range rapid.IntRange(0, 10).Draw(rt, "before") {
			a, b := single.claim(req), batch.claim(req)
			require.Equal(rt, a.Task.ID, b.Task.ID)
		}
		n := rapid.IntRange(2, 24).Draw(rt, "n")
		var pinned bool
		require.NoError(rt, batch.db.QueryRow(batch.ctx, `SELECT EXISTS (SELECT 1 FROM tasks
			WHERE state = 'pending' AND sticky_worker = 'w' AND sticky_until > $1 AND due_at <= $1)`, req.Now).Scan(&pinned))
		calls0, steps0 := bulkCalls(rt), stepCalls(rt)
		// Shallow batches take their first rows by single steps, then go
		// on in bulk: the same results either way.
		breq := req
		breq.Shallow = rapid.Bool().Draw(rt, "shallow")
		got, err := claim.ClaimBatch(batch.ctx, conn, breq, n)
		require.NoError(rt, err)
		if pinned && bulkCalls(rt) > calls0 {
			pinnedThenBulk++
		}
		pinnedGot := 0
		for _, r := range got {
			if r.OK && r.Task.StickyWorker == "w" && r.Task.StickyUntil.After(req.Now) {
				pinnedGot++
			}
		}
		if pinnedGot-(stepCalls(rt)-steps0) >= 2 {
			stickyMany++
		}
		var want []claim.Result
		for range n {
			r := single.claim(req)
			if !r.OK {
				if r.Empty == claim.EmptyRefused {
					want = append(want, r)
				}
				break
			}
			want = append(want, r)
		}
		require.Len(rt, got, len(want))
		for i := range want {
			require.Equal(rt, want[i].OK, got[i].OK, "result %d", i)
			require.Equal(rt, want[i].Task.ID, got[i].Task.ID, "result %d", i)
			require.Equal(rt, want[i].Lag, got[i].Lag, "lag of result %d", i)
			require.Equal(rt, want[i].Empty, got[i].Empty, "result %d", i)
			require.Equal(rt, want[i].Refused, got[i].Refused, "refusals of result %d", i)
			if len(got[i].Refused) > 0 {
				refusedInBatch++
			}
		}
		var wb, gb []string
		for _, b := range []*bundle{single, batch} {
			rows, err := b.db.Query(b.ctx, `SELECT quota_key || ':' || tokens || '@' || updated_at FROM rate_buckets ORDER BY quota_key`)
			require.NoError(rt, err)
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(rt, err)
			if b == single {
				wb = got
			} else {
				gb = got
			}
		}
		require.Equal(rt, wb, gb, "rate buckets")
		ws, err := claim.FairState(single.ctx, single.db)
		require.NoError(rt, err)
		gs, err := claim.FairState(batch.ctx, batch.db)
		require.NoError(rt, err)
		require.Equal(rt, ws, gs)
		require.Equal(rt, single.clock(), batch.clock())
		require.Equal(rt, single.summaries(), batch.summaries())
	})
	plans := bulkCalls(t)
	t.Logf("bulk plans: %d; batches that began with pinned rows and went on in bulk: %d; batch results with refusals: %d; "+
		"batches that took two pinned rows or more by sticky steps: %d", plans, pinnedThenBulk, refusedInBatch, stickyMany)
	require.Positive(t, plans, "no batch was planned in bulk")
	require.Positive(t, pinnedThenBulk, "no batch went on in bulk after its pinned rows")
	require.Positive(t, stickyMany, "no sticky step took two pinned rows")
}

func (b *bundle) clock() float64 {
	b.t.Helper()
	var v float64
	require.NoError(b.t, b.db.QueryRow(b.ctx, `SELECT harvest_clock('q')`).Scan(&v))
	return v
}

// A shallow batch takes its first claim.ShallowSingles rows by single
// steps and plans in bulk only after them: with two rows waiting it plans
// nothing, where a batch that is not shallow plans at once. Either way it
// takes what as many single claims of the model would.
func TestFairBatchShallowTakesSingleStepsFirst(t *testing.T) {
	t.Parallel()
	atEachLevel(t, func(t *testing.T, tw *refusedHeadTwin, twoLevel bool) {
		bulkFn := bulkStepFn(twoLevel)
		conn, calls := stepCounter(t, tw.b)
		counts := func() (steps, bulk int) {
			return int(calls("harvest_claim_step")), int(calls(bulkFn))
		}
		req := tw.req(true, "w", 0)
		take := func(shallow bool, n int) (steps, bulk int) {
			t.Helper()
			s0, b0 := counts()
			tw.shallow = shallow
			tw.batchOn(t, conn, req, n)
			s1, b1 := counts()
			return s1 - s0, b1 - b0
		}

		// Two rows wait: single steps take both, and a third finds none.
		tw.add("a", "", 0, 1, "")
		tw.add("b", "", 0, 2, "")
		steps, bulk := take(true, 10)
		require.Equal(t, 3, steps, "single steps of the shallow batch")
		require.Zero(t, bulk, "bulk steps of the shallow batch")
		tw.add("a", "", 0, 3, "")
		tw.add("b", "", 0, 4, "")
		_, bulk = take(false, 10)
		require.Positive(t, bulk, "bulk steps of a batch that is not shallow")

		// A deep queue: single steps first, then bulk.
		for i := range 16 {
			tw.add(fmt.Sprintf("k%d", i%4), "", 0, 10+i, "")
		}
		steps, bulk = take(true, 12)
		require.GreaterOrEqual(t, steps, claim.ShallowSingles, "single steps of the shallow batch")
		require.Positive(t, bulk, "bulk steps after the single ones")
	})
}

// A sticky step plans only the first n pinned rows of each key (n the
// rows the batch still wants): no more can be among the n it takes. Here
// one key's rows all come before the other's first (it weighs 10 and has
// no debt; the other was charged twice), so a plan cut shorter than n
// rows per key would put the other key's row in too early. The batch
// takes what n single claims take, in one sticky step.
func TestStickyStepPlansEnoughRowsOfAKey(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	conn, calls := plCalls(t, batch)
	now := t0.Add(time.Hour)
	for _, b := range []*bundle{single, batch} {
		run := b.run(runOpts{MaxAttempts: 100})
		b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'a', 10)`)
		// b is charged twice first (another worker's claims).
		b.tasks(2, taskOpts{RunPK: run, Key: "b", DueAt: t0, Now: now})
		for range 2 {
			res := b.claim(claim.Request{Queue: "q", Worker: "v", Fair: true, Now: now, Lease: time.Minute})
			require.True(t, res.OK)
			require.Equal(t, "b", res.Task.Key)
		}
		b.tasks(2, taskOpts{RunPK: run, Key: "b", DueAt: t0, StickyWorker: "w", StickyUntil: now.Add(time.Hour), Now: now})
		b.tasks(8, taskOpts{RunPK: run, Key: "a", DueAt: t0, StickyWorker: "w", StickyUntil: now.Add(time.Hour), Now: now})
	}
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Now: now, Lease: time.Minute}
	const n = 6
	sticky0, steps0 := calls(t, "harvest_claim_bulk_sticky"), calls(t, "harvest_claim_step")
	got, err := claim.ClaimBatch(batch.ctx, conn, req, n)
	require.NoError(t, err)
	require.Len(t, got, n)
	require.Equal(t, sticky0+1, calls(t, "harvest_claim_bulk_sticky"), "one sticky step")
	require.Equal(t, steps0, calls(t, "harvest_claim_step"), "no single step")
	for i := range n {
		want := single.claim(req)
		require.True(t, want.OK)
		require.Equal(t, "a", want.Task.Key, "claim %d: the heavy key's rows come first", i)
		require.Equal(t, want.Task.ID, got[i].Task.ID, "claim %d", i)
		require.Equal(t, want.Lag, got[i].Lag, "lag of claim %d", i)
	}
}
