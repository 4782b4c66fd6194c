package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

// refusedHeadTwin enqueues the same rows in the database and in the
// reference model, so that a test can require the SQL claim to take what
// the model takes.
type refusedHeadTwin struct {
	b   *bundle
	m   *fairkeys.Model
	run int64
	// shallow is the Shallow of the SQL side's batch requests.
	shallow bool
}

func newRefusedHeadTwin(t *testing.T) *refusedHeadTwin {
	b := setup(t)
	return &refusedHeadTwin{b: b, m: fairkeys.NewModel(), run: b.run(runOpts{MaxAttempts: 1_000})}
}

func (tw *refusedHeadTwin) quota(qk string, q fairkeys.Quota) {
	var capArg, rate, burst any
	if q.MaxConcurrent > 0 {
		capArg = q.MaxConcurrent
	}
	if q.Rate > 0 {
		rate, burst = q.Rate, q.Burst
	}
	tw.b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES ('q', $1, $2, $3, $4)`,
		qk, capArg, rate, burst)
	tw.m.SetQuota("q", qk, q)
}

// add enqueues a row of key due at t0 + due seconds.
func (tw *refusedHeadTwin) add(key, qk string, prio, due int, pinnedTo string) int64 {
	task := fairkeys.Task{Queue: "q", Key: key, QuotaKey: qk, Priority: prio, DueAt: t0.Add(time.Duration(due) * time.Second)}
	if pinnedTo != "" {
		task.StickyWorker, task.StickyUntil = pinnedTo, t0.Add(time.Hour)
	}
	task.ID = tw.b.task(taskOpts{RunPK: tw.run, Queue: "q", Key: key, QuotaKey: qk, Priority: prio,
		DueAt: task.DueAt, StickyWorker: task.StickyWorker, StickyUntil: task.StickyUntil, Now: t0})
	tw.m.Insert(task)
	return task.ID
}

// takeByID claims row id by its id, ordinarily, on both sides.
func (tw *refusedHeadTwin) takeByID(t *testing.T, id int64) {
	t.Helper()
	req := tw.req(false, "", 0)
	require.True(t, tw.m.ClaimByID(id, req).OK)
	r, err := claim.ClaimByID(tw.b.ctx, tw.b.db, id, sqlRequest(req))
	require.NoError(t, err)
	require.True(t, r.OK)
}

// fillCap caps quota key "capped" at one running task and fills the cap
// with a row of key, taken by an ordinary claim.
func (tw *refusedHeadTwin) fillCap(t *testing.T, key string) {
	t.Helper()
	tw.quota("capped", fairkeys.Quota{MaxConcurrent: 1})
	tw.takeByID(t, tw.add(key, "capped", 0, 0, ""))
}

// twoLevel turns two-level fairness on for queue "q" on both sides.
func (tw *refusedHeadTwin) twoLevel() {
	tw.b.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'test')`)
	tw.m.SetTwoLevel("q", true)
}

func (tw *refusedHeadTwin) req(fair bool, worker string, aging int) fairkeys.ClaimRequest {
	return fairkeys.ClaimRequest{Queue: "q", Worker: worker, Now: t0.Add(time.Minute), Fair: fair, AgingSecs: aging}
}

func resultText(ok bool, id int64, empty string, lag float64, refused []fairkeys.Refusal) string {
	return fmt.Sprintf("ok=%v id=%d empty=%q lag=%v refused=%v", ok, id, empty, lag, refused)
}

// claim runs one claim on both sides and requires the same answer; it
// returns the model's.
func (tw *refusedHeadTwin) claim(t *testing.T, req fairkeys.ClaimRequest) fairkeys.ClaimResult {
	t.Helper()
	want := tw.m.Claim(req)
	got, err := claim.Claim(tw.b.ctx, tw.b.db, sqlRequest(req))
	require.NoError(t, err)
	var ref []fairkeys.Refusal
	for _, r := range got.Refused {
		ref = append(ref, fairkeys.Refusal(r))
	}
	require.Equal(t, resultText(want.OK, want.Task.ID, want.Empty, want.Lag, want.Refused),
		resultText(got.OK, got.Task.ID, got.Empty, got.Lag, ref), "claim %+v", req)
	return want
}

// A fair claim that refuses a key's head leaves the whole key out: the
// key's later rows, with no quota key or another one, wait behind their
// head instead of running ahead of it. A key whose head carries a quota
// key refused earlier in the claim is left out with no refusal of its own.
// The single claim follows the model in each pick the claim can use, and
// an ordinary claim still reads on past the refused quota key.
func TestFairRefusedHeadHoldsItsKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		worker string
		aging  int
		pinned bool
	}{
		{name: "by heads"},
		{name: "by the full sort (ageing)", aging: 3600},
		{name: "pinned head", worker: "w1", pinned: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tw := newRefusedHeadTwin(t)
			tw.fillCap(t, "z")

			// Key a: a capped head, then a row without a quota key and one
			// of another quota key. Key b: a capped head with a free row
			// behind it. Key c, of a lower priority: free.
			pin := ""
			if c.pinned {
				pin = c.worker
			}
			a1 := tw.add("a", "capped", 1, 1, pin)
			a2 := tw.add("a", "", 1, 2, "")
			a3 := tw.add("a", "other", 1, 3, "")
			tw.add("b", "capped", 1, 4, "")
			b2 := tw.add("b", "", 1, 5, "")
			c1 := tw.add("c", "", 0, 6, "")

			r := tw.claim(t, tw.req(true, c.worker, c.aging))
			require.Equal(t, c1, r.Task.ID, "only key c is left to the claim")
			require.Equal(t, []fairkeys.Refusal{{TaskID: a1, QuotaKey: "capped", Reason: fairkeys.ReasonConcurrencyCap}},
				r.Refused, "key b's head is left out without a recheck")
			r = tw.claim(t, tw.req(true, c.worker, c.aging))
			require.False(t, r.OK)
			require.Equal(t, fairkeys.EmptyRefused, r.Empty)
			for _, id := range []int64{a1, a2, a3, b2} {
				require.Equal(t, "pending", tw.b.row(id).State, "row %d waits behind its key's head", id)
			}

			// An ordinary claim has no keys to hold: it skips the quota key.
			r = tw.claim(t, tw.req(false, c.worker, c.aging))
			require.True(t, r.OK)
			require.NotEqual(t, a1, r.Task.ID)
		})
	}
}

// A row pinned to the claiming worker is its key's head for that worker's
// claims, even below the key's other rows: when such a head carries a quota
// key refused earlier in the claim, the key's rows that are not pinned wait
// too (harvest_claim_step leaves the key out itself, since the picks after
// the pinned one do not see pins). Another worker's claim sees the key's
// other head and takes it.
func TestFairRefusedPinnedHeadHoldsItsKey(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	tw.fillCap(t, "z")
	d1 := tw.add("d", "capped", 1, 1, "w1")
	tw.add("e", "capped", 0, 2, "w1")
	e2 := tw.add("e", "", 1, 3, "")
	c1 := tw.add("c", "", 0, 4, "")
	r := tw.claim(t, tw.req(true, "w1", 0))
	require.Equal(t, c1, r.Task.ID, "key e waits behind its pinned head")
	require.Equal(t, []fairkeys.Refusal{{TaskID: d1, QuotaKey: "capped", Reason: fairkeys.ReasonConcurrencyCap}}, r.Refused)
	r = tw.claim(t, tw.req(true, "w2", 0))
	require.Equal(t, e2, r.Task.ID, "for w2 the pinned rows are not heads")
}

// batch claims n rows in one batch and requires what n single claims of
// the model give, one result at a time (refusals included); it returns the
// SQL's results.
func (tw *refusedHeadTwin) batch(t *testing.T, req fairkeys.ClaimRequest, n int) []claim.Result {
	t.Helper()
	return tw.batchOn(t, tw.b.db, req, n)
}

func (tw *refusedHeadTwin) batchOn(t *testing.T, db shard.Querier, req fairkeys.ClaimRequest, n int) []claim.Result {
	t.Helper()
	sreq := sqlRequest(req)
	sreq.Shallow = tw.shallow
	got, err := claim.ClaimBatch(tw.b.ctx, db, sreq, n)
	require.NoError(t, err)
	var want, have []string
	for range n {
		r := tw.m.Claim(req)
		if !r.OK && r.Empty != fairkeys.EmptyRefused {
			break
		}
		want = append(want, resultText(r.OK, r.Task.ID, r.Empty, r.Lag, r.Refused))
		if !r.OK {
			break
		}
	}
	for _, g := range got {
		var ref []fairkeys.Refusal
		for _, r := range g.Refused {
			ref = append(ref, fairkeys.Refusal(r))
		}
		have = append(have, resultText(g.OK, g.Task.ID, g.Empty, g.Lag, ref))
	}
	require.Equal(t, want, have, "batch of %d %+v", n, req)
	return got
}

// The batch takes what as many single claims of the model would, when the
// first of them refuses a key's head.
func TestFairRefusedHeadBatch(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	tw.fillCap(t, "z")
	tw.add("a", "capped", 0, 1, "")
	tw.add("a", "", 0, 2, "")
	tw.add("a", "other", 0, 3, "")
	for i := range 4 {
		tw.add("b", "", 0, 10+i, "")
		tw.add("c", "", 0, 20+i, "")
	}
	got := tw.batch(t, tw.req(true, "w1", 0), 10)
	require.Len(t, got, 9, "eight rows of keys b and c, then the refusal")
}

// Rows with quota keys go through the fair batch's rechecks as they would
// through single claims: accepted while the cap and the bucket allow, the
// key of the first row refused left out of the rest of each claim with
// the refusal reported on every later claim that reaches it, the rows
// behind it waiting, and the bucket and the cap where single claims would
// leave them.
func TestFairBatchQuotaRechecks(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	tw.quota("capped", fairkeys.Quota{MaxConcurrent: 3})
	tw.quota("rated", fairkeys.Quota{Rate: 0.5, Burst: 2})
	tw.quota("loose", fairkeys.Quota{MaxConcurrent: 100, Rate: 100, Burst: 50})
	quotas := []string{"capped", "rated", "loose", "", "unset"}
	due := 0
	for i := range 6 {
		for k, key := range []string{"a", "b", "c", "d"} {
			due++
			tw.add(key, quotas[(i+k)%len(quotas)], 0, due, "")
		}
	}
	req := tw.req(true, "", 0)
	tw.batch(t, req, 12)
	tw.batch(t, req, 12)
	tw.batch(t, req, 12)

	// The quota rows where the single claims would leave them.
	var tokens float64
	require.NoError(t, tw.b.db.QueryRow(tw.b.ctx,
		`SELECT tokens FROM rate_buckets WHERE queue = 'q' AND quota_key = 'loose'`).Scan(&tokens))
	require.Equal(t, 50-float64(tw.m.Running("q", "loose")), tokens, "one token per row taken, all at one time")
	var capped int
	require.NoError(t, tw.b.db.QueryRow(tw.b.ctx,
		`SELECT count(*) FROM tasks WHERE quota_key = 'capped' AND state = 'running'`).Scan(&capped))
	require.Equal(t, 3, capped)
	require.Equal(t, 3, tw.m.Running("q", "capped"))
}

// capFull makes quota key "capped" (a cap of one) full on both sides: its
// one row, of key z, claimed fairly (an ordinary claim would leave the
// summary's head of z stale, and a stale head ends every bulk plan). It
// returns the connection to make every claim on, and the count of single
// claim steps made on it so far (stepCounter says why one connection).
func (tw *refusedHeadTwin) capFull(t *testing.T) (*pgxpool.Conn, func() int) {
	t.Helper()
	conn, calls := tw.capFullCounted(t)
	return conn, func() int { return int(calls("harvest_claim_step")) }
}

// capFullCounted is capFull counting the calls of any function by name.
func (tw *refusedHeadTwin) capFullCounted(t *testing.T) (*pgxpool.Conn, func(fn string) float64) {
	t.Helper()
	tw.quota("capped", fairkeys.Quota{MaxConcurrent: 1})
	z := tw.add("z", "capped", 0, 0, "")
	require.True(t, tw.m.ClaimByID(z, tw.req(true, "", 0)).OK)
	conn, calls := stepCounter(t, tw.b)
	_, err := claim.ClaimByID(tw.b.ctx, conn, z, sqlRequest(tw.req(true, "", 0)))
	require.NoError(t, err)
	return conn, calls
}

// bulkStepFn names the bulk step of a fair batch: the two-level one in a
// two-level queue.
func bulkStepFn(twoLevel bool) string {
	if twoLevel {
		return "harvest_claim_bulk_group"
	}
	return "harvest_claim_bulk_fair"
}

// atEachLevel runs test in parallel subtests on a fresh twin, in a
// one-level queue and in a two-level one.
func atEachLevel(t *testing.T, test func(t *testing.T, tw *refusedHeadTwin, twoLevel bool)) {
	for _, twoLevel := range []bool{false, true} {
		t.Run(fmt.Sprintf("two-level=%v", twoLevel), func(t *testing.T) {
			t.Parallel()
			tw := newRefusedHeadTwin(t)
			if twoLevel {
				tw.twoLevel()
			}
			test(t, tw, twoLevel)
		})
	}
}

// A refused head of a higher priority than the rest of the backlog stays
// refused for the whole batch: once a single step has refused it, the bulk
// steps leave its key out and report its refusal on every row they take,
// as each single claim would, instead of falling back to single steps.
func TestFairBatchRefusedHeadAbove(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	conn, steps := tw.capFull(t)
	tw.add("h", "capped", 1, 1, "")
	tw.add("h", "", 1, 2, "")
	tw.add("g", "capped", 1, 3, "") // silent: the same quota key
	for i := range 6 {
		tw.add("b", "", 0, 10+i, "")
		tw.add("c", "", 0, 20+i, "")
	}
	before := steps()
	got := tw.batchOn(t, conn, tw.req(true, "w1", 0), 10)
	require.Len(t, got, 10)
	require.Equal(t, 1, steps()-before, "one single step refuses the head; the bulk steps take the rest")
}

// Many refused heads of the batch's priority, more than a bulk step's
// candidates: every bulk step would take nothing (refused heads are never
// charged, so they stay in front) and each row falls to a single step. The
// batch stops trying bulk steps after every row: it waits 1, 3, 7, ...
// single steps between tries, and takes what the model's single claims
// take all the same. One- and two-level; in the one-level queue the 2,100
// refused keys are more than the pick after a refusal walks (2,000) before
// it reads every key's head at once.
func TestFairBatchManyRefusedKeysBackOffBulk(t *testing.T) {
	t.Parallel()
	atEachLevel(t, func(t *testing.T, tw *refusedHeadTwin, twoLevel bool) {
		bulkFn := bulkStepFn(twoLevel)
		conn, calls := tw.capFullCounted(t)
		// Due at once (pending, not scheduled: a claim promotes at
		// most 1,000 scheduled rows).
		for k := range 2100 {
			tw.add(fmt.Sprintf("r%04d", k), "capped", 0, 0, "")
		}
		for range 3 {
			for k := range 20 {
				tw.add(fmt.Sprintf("k%02d", k), "", 0, 0, "")
			}
		}
		bulk0, steps0 := calls(bulkFn), calls("harvest_claim_step")
		got := tw.batchOn(t, conn, tw.req(true, "w1", 0), 30)
		require.Len(t, got, 30)
		bulk, steps := calls(bulkFn)-bulk0, calls("harvest_claim_step")-steps0
		t.Logf("%v bulk steps, %v single steps for 30 rows", bulk, steps)
		require.Equal(t, 30.0, steps, "every row is a single step")
		// Bulk tries before rows 1, 2, 4, 8 and 16.
		require.Equal(t, 5.0, bulk, "the batch backs off the bulk steps that take nothing")
	})
}

// A refused head among more keys than the batch asks for leaves the rest
// of the plan in bulk: every other candidate's head is claimed before any
// key outside the candidates, so the plan keeps them. (It used to stop at
// the outside key's start tag once a key had left the plan; with every key
// at the clock that is the first row, and the batch took single steps.)
func TestFairBatchRefusedHeadAmongManyKeys(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	conn, steps := tw.capFull(t)
	tw.add("a", "capped", 0, 1, "")
	tw.add("a", "", 0, 2, "")
	// Thirty keys of two rows, the first rows due before the second ones
	// and each due time in key order (rows of one due time go by id).
	for i := range 2 {
		for k := range 30 {
			tw.add(fmt.Sprintf("k%02d", k), "", 0, 10+10*i, "")
		}
	}
	before := steps()
	got := tw.batchOn(t, conn, tw.req(true, "w1", 0), 10)
	require.Len(t, got, 10)
	// One bulk step takes nine rows (its ten candidates less the refused
	// one), and the last row, cheaper alone, is a single step.
	require.Equal(t, 1, steps()-before, "one bulk step, then one single step for the last row")
	// The next batch meets the claimed keys' second rows, whose tags are
	// above the clock: the twenty keys not claimed yet come first, then
	// the second rows of the four candidates in debt, and the best key left
	// outside would come next.
	got = tw.batchOn(t, conn, tw.req(true, "w1", 0), 25)
	require.Len(t, got, 25)
	require.Equal(t, 2, steps()-before, "one bulk step of 24 rows, then one single step")
}

// The picks after a refusal walk the keys in the order of their summary
// and read each head by id. A head that left the pending state without the
// summary knowing (an ordinary claim took it) must be repaired and its key
// compared again by its next row, not passed over: here key b's next row
// comes before key c's head, so the claim that refuses key a takes b2.
// Both the one-level and the two-level pick.
func TestFairRefusalRepairsAStaleHead(t *testing.T) {
	t.Parallel()
	atEachLevel(t, func(t *testing.T, tw *refusedHeadTwin, _ bool) {
		tw.fillCap(t, "g0/z")

		w1 := tw.add("g3/w", "", 1, 0, "")
		a1 := tw.add("g1/a", "capped", 0, 1, "")
		b1 := tw.add("g1/b", "", 0, 2, "")
		b2 := tw.add("g1/b", "", 0, 3, "")
		tw.add("g2/c", "", 0, 4, "")

		// The first fair claim folds every head into the summary and
		// takes the higher priority.
		require.Equal(t, w1, tw.claim(t, tw.req(true, "", 0)).Task.ID)
		// An ordinary claim takes key b's head behind the summary's back.
		tw.takeByID(t, b1)

		r2 := tw.claim(t, tw.req(true, "", 0))
		require.Equal(t, b2, r2.Task.ID, "key b's next row comes before key c's head")
		require.Equal(t, []fairkeys.Refusal{{TaskID: a1, QuotaKey: "capped", Reason: fairkeys.ReasonConcurrencyCap}},
			r2.Refused)
	})
}
