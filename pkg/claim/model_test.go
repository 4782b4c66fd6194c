package claim_test

import (
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// The SQL claim must follow the reference model of pkg/fairkeys step by
// step: the same random operations go to both, and after each one the pick,
// the empty reason, the refusals, the lag and every fairness state row must
// agree.

var (
	mQueues = []string{"q1", "q2"}
	// "a", "a/1" and "a/2" are one group in a two-level queue.
	mKeys      = []string{fairkeys.DefaultKey, "a", "b", "c", "a/1", "a/2", "b/1"}
	mGroups    = []string{"a", "b", "c"}
	mQuotaKeys = []string{"", "x", "y"}
	mWorkers   = []string{"", "w1", "w2"}
)

type modelMachine struct {
	stats  *modelStats
	b      *bundle
	m      *fairkeys.Model
	now    time.Time
	run    int64
	tokens map[int64]uuid.UUID // running tasks in the database, by id
	maxID  int64
	heldID int64 // the last fair_held row given to the model
}

// ended tells the model about attempts the database just took out of
// running: those billed by runtime in the order their fair_held rows were
// written, with the time the database measured, then the rest (end is
// called with 0 held seconds for those, which record nothing).
func (mm *modelMachine) ended(t *rapid.T, ids []int64, end func(id int64, heldSecs float64)) {
	rows, err := mm.b.db.Query(mm.b.ctx, `SELECT id, task_id, secs FROM fair_held WHERE id > $1 ORDER BY id`, mm.heldID)
	require.NoError(t, err)
	seen := map[int64]bool{}
	for rows.Next() {
		var id, task int64
		var secs float64
		require.NoError(t, rows.Scan(&id, &task, &secs))
		mm.heldID = id
		require.Contains(t, ids, task, "a held row for a task that did not end")
		require.False(t, seen[task], "two held rows for one attempt of task %d", task)
		seen[task] = true
		end(task, secs)
		mm.stats.held++
	}
	require.NoError(t, rows.Err())
	for _, id := range ids {
		if !seen[id] {
			end(id, 0)
		}
	}
}

func (mm *modelMachine) ms(t *rapid.T, label string, lo, hi int) time.Duration {
	return time.Duration(rapid.IntRange(lo, hi).Draw(t, label)) * time.Millisecond
}

func (mm *modelMachine) running(t *rapid.T) (int64, bool) {
	if len(mm.tokens) == 0 {
		return 0, false
	}
	var ids []int64
	for id := range mm.tokens {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return rapid.SampledFrom(ids).Draw(t, "running"), true
}

func (mm *modelMachine) insert(t *rapid.T) { mm.insertTask(t, false) }

// insertPinned adds a row without a quota key pinned to a worker: with
// claimBatchPinned, the shape in which a batch takes the rows pinned to
// its worker by single steps and goes on in bulk (most rows of insert
// have a quota key, before which every bulk step stops).
func (mm *modelMachine) insertPinned(t *rapid.T) { mm.insertTask(t, true) }

func (mm *modelMachine) insertTask(t *rapid.T, pinned bool) {
	task := fairkeys.Task{
		Queue:        rapid.SampledFrom(mQueues).Draw(t, "queue"),
		Key:          rapid.SampledFrom(mKeys).Draw(t, "key"),
		Priority:     rapid.IntRange(-1, 2).Draw(t, "prio"),
		Continuation: rapid.Bool().Draw(t, "cont"),
	}
	switch {
	case pinned:
		// Due, and pinned for a while yet: the batch has to take it first.
		task.DueAt = mm.now.Add(mm.ms(t, "due", -3000, 0).Truncate(250 * time.Millisecond))
		task.StickyWorker = rapid.SampledFrom(mWorkers[1:]).Draw(t, "stickyWorker")
		task.StickyUntil = mm.now.Add(mm.ms(t, "stickyFor", 1, 4000))
	default:
		task.DueAt = mm.now.Add(mm.ms(t, "due", -3000, 3000).Truncate(250 * time.Millisecond))
		task.QuotaKey = rapid.SampledFrom(mQuotaKeys).Draw(t, "quota")
		if rapid.IntRange(0, 3).Draw(t, "sticky?") == 0 {
			task.StickyWorker = rapid.SampledFrom(mWorkers[1:]).Draw(t, "stickyWorker")
			task.StickyUntil = mm.now.Add(mm.ms(t, "stickyFor", -1000, 4000))
		}
	}
	id := mm.b.task(taskOpts{RunPK: mm.run, Queue: task.Queue, Key: task.Key, QuotaKey: task.QuotaKey,
		Priority: task.Priority, Continuation: task.Continuation, DueAt: task.DueAt,
		StickyWorker: task.StickyWorker, StickyUntil: task.StickyUntil, Now: mm.now})
	task.ID = id
	mm.maxID = max(mm.maxID, id)
	mm.m.Insert(task)
}

// insertBacklog adds a key's head with a quota key and rows behind it in
// the same key with no quota key or the other one: the shape in which a
// fair claim that refuses the head must not read past it into the key's
// backlog.
func (mm *modelMachine) insertBacklog(t *rapid.T) {
	queue := rapid.SampledFrom(mQueues).Draw(t, "queue")
	key := rapid.SampledFrom(mKeys).Draw(t, "key")
	qk := rapid.SampledFrom(mQuotaKeys[1:]).Draw(t, "quota")
	prio := rapid.IntRange(0, 2).Draw(t, "prio")
	due := mm.now.Add(mm.ms(t, "due", -3000, 0).Truncate(250 * time.Millisecond))
	rows := []fairkeys.Task{{Queue: queue, Key: key, QuotaKey: qk, Priority: prio, DueAt: due}}
	for i := range rapid.IntRange(1, 3).Draw(t, "behind") {
		behind := rapid.SampledFrom([]string{"", "x", "y"}).Draw(t, "behindQuota")
		rows = append(rows, fairkeys.Task{Queue: queue, Key: key, QuotaKey: behind,
			Priority: prio - rapid.IntRange(0, 1).Draw(t, "lower"),
			DueAt:    due.Add(time.Duration(i+1) * 250 * time.Millisecond)})
	}
	for _, task := range rows {
		task.ID = mm.b.task(taskOpts{RunPK: mm.run, Queue: task.Queue, Key: task.Key, QuotaKey: task.QuotaKey,
			Priority: task.Priority, DueAt: task.DueAt, Now: mm.now})
		mm.maxID = max(mm.maxID, task.ID)
		mm.m.Insert(task)
	}
}

// heldBacklog counts the refusals of a fair claim whose key still has a
// due pending row of no quota key or another one: a backlog the claim did
// not read past (the model and the SQL agreed on the result before this is
// counted).
func (mm *modelMachine) heldBacklog(t *rapid.T, req fairkeys.ClaimRequest, refused []fairkeys.Refusal) {
	if !req.Fair {
		return
	}
	for _, r := range refused {
		var held bool
		require.NoError(t, mm.b.db.QueryRow(mm.b.ctx, `SELECT EXISTS (
			SELECT 1 FROM tasks h JOIN tasks y ON y.queue = h.queue AND y.fairness_key = h.fairness_key
			WHERE h.id = $1 AND y.id <> h.id AND y.state = 'pending' AND y.quota_key <> h.quota_key
			  AND y.due_at <= $2)`, r.TaskID, req.Now).Scan(&held))
		if held {
			mm.stats.heldBacklog++
		}
	}
}

func (mm *modelMachine) compare(t *rapid.T, what string, want fairkeys.ClaimResult, got claim.Result) {
	if got.OK {
		mm.tokens[got.Task.ID] = got.Task.LeaseToken
		mm.stats.ok++
	}
	mm.stats.refused += len(got.Refused)
	if got.Lag > 0 {
		mm.stats.lagged++
	}
	var wantRef, gotRef []string
	for _, r := range want.Refused {
		wantRef = append(wantRef, fmt.Sprintf("%d/%s/%s", r.TaskID, r.QuotaKey, r.Reason))
	}
	for _, r := range got.Refused {
		gotRef = append(gotRef, fmt.Sprintf("%d/%s/%s", r.TaskID, r.QuotaKey, r.Reason))
	}
	w := fmt.Sprintf("ok=%v id=%d empty=%q lag=%v refused=%v", want.OK, want.Task.ID, want.Empty, want.Lag, wantRef)
	g := fmt.Sprintf("ok=%v id=%d empty=%q lag=%v refused=%v", got.OK, got.Task.ID, got.Empty, got.Lag, gotRef)
	if w != g {
		t.Fatalf("%s: model %s, sql %s", what, w, g)
	}
}

// batch claims n rows in one batch: it must give what the same number of
// single claims would, one result at a time; the bulk steps of the batch
// are checked against the model here.
func (mm *modelMachine) batch(t *rapid.T, req fairkeys.ClaimRequest, n int) {
	b := mm.b
	sreq := sqlRequest(req)
	sreq.Shallow = rapid.Bool().Draw(t, "shallow")
	got, err := claim.ClaimBatch(b.ctx, b.db, sreq, n)
	require.NoError(t, err)
	var want []fairkeys.ClaimResult
	for range n {
		r := mm.m.Claim(req)
		if !r.OK {
			if r.Empty == claim.EmptyRefused {
				want = append(want, r)
			}
			break
		}
		want = append(want, r)
	}
	if len(got) != len(want) {
		t.Fatalf("claim batch of %d %+v: model gave %d results, sql %d", n, req, len(want), len(got))
	}
	pinned := func(r fairkeys.ClaimResult) bool {
		return r.OK && r.Task.StickyWorker == req.Worker && r.Task.StickyUntil.After(req.Now)
	}
	for i := range want {
		mm.compare(t, fmt.Sprintf("claim batch %d/%d %+v", i+1, n, req), want[i], got[i])
		mm.heldBacklog(t, req, want[i].Refused)
		if i > 0 && pinned(want[i-1]) && want[i].OK && !pinned(want[i]) {
			mm.stats.pinnedFirst++
		}
	}
}

func (mm *modelMachine) request(t *rapid.T) fairkeys.ClaimRequest {
	return fairkeys.ClaimRequest{
		Queue:     rapid.SampledFrom(mQueues).Draw(t, "queue"),
		Worker:    rapid.SampledFrom(mWorkers).Draw(t, "worker"),
		Now:       mm.now,
		Fair:      rapid.IntRange(0, 3).Draw(t, "fair") > 0,
		AgingSecs: rapid.SampledFrom([]int{0, 0, 0, 1, 4}).Draw(t, "aging"),
	}
}

func sqlRequest(r fairkeys.ClaimRequest) claim.Request {
	return claim.Request{Queue: r.Queue, Worker: r.Worker, Now: r.Now, Fair: r.Fair, AgingSecs: r.AgingSecs, Lease: time.Hour}
}

func (mm *modelMachine) actions() map[string]func(*rapid.T) {
	b := mm.b
	return map[string]func(*rapid.T){
		"insert": mm.insert,
		"claim": func(t *rapid.T) {
			req := mm.request(t)
			got, err := claim.Claim(b.ctx, b.db, sqlRequest(req))
			require.NoError(t, err)
			want := mm.m.Claim(req)
			mm.compare(t, fmt.Sprintf("claim %+v", req), want, got)
			mm.heldBacklog(t, req, want.Refused)
		},
		"claimByID": func(t *rapid.T) {
			if mm.maxID == 0 {
				t.Skip("no task yet")
			}
			id := rapid.Int64Range(1, mm.maxID).Draw(t, "id")
			req := mm.request(t)
			got, err := claim.ClaimByID(b.ctx, b.db, id, sqlRequest(req))
			require.NoError(t, err)
			mm.compare(t, fmt.Sprintf("claim by id %d %+v", id, req), mm.m.ClaimByID(id, req), got)
		},
		"claimBatch": func(t *rapid.T) {
			mm.batch(t, mm.request(t), rapid.IntRange(1, 6).Draw(t, "n"))
		},
		"insertPinned":  mm.insertPinned,
		"insertBacklog": mm.insertBacklog,
		"claimBatchPinned": func(t *rapid.T) {
			// A named worker and no ageing: the batches that may take
			// pinned rows first and then bulk steps.
			req := mm.request(t)
			req.Worker = rapid.SampledFrom(mWorkers[1:]).Draw(t, "pinnedWorker")
			req.AgingSecs = 0
			mm.batch(t, req, rapid.IntRange(2, 6).Draw(t, "n"))
		},
		"completeBatch": func(t *rapid.T) {
			if len(mm.tokens) == 0 {
				t.Skip("nothing running")
			}
			var ids []int64
			for id := range mm.tokens {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			pick := rapid.SliceOfNDistinct(rapid.SampledFrom(ids), 1, 4, rapid.ID[int64]).Draw(t, "ids")
			var cs []claim.Completion
			for _, id := range pick {
				cs = append(cs, claim.Completion{ID: id, Token: mm.tokens[id]})
			}
			// A stale token rides along and must change nothing.
			stale := rapid.SampledFrom(ids).Draw(t, "stale")
			cs = append(cs, claim.Completion{ID: stale, Token: uuid.New()})
			errs, err := claim.CompleteBatch(b.ctx, b.db, cs)
			require.NoError(t, err)
			for i := range pick {
				require.NoError(t, errs[i])
			}
			require.ErrorIs(t, errs[len(pick)], claim.ErrStaleLease)
			for _, id := range pick {
				delete(mm.tokens, id)
			}
			mm.ended(t, pick, mm.m.CompleteHeld)
		},
		"complete": func(t *rapid.T) {
			id, ok := mm.running(t)
			if !ok {
				t.Skip("nothing running")
			}
			require.NoError(t, claim.Complete(b.ctx, b.db, id, mm.tokens[id], nil))
			delete(mm.tokens, id)
			mm.ended(t, []int64{id}, mm.m.CompleteHeld)
		},
		"requeue": func(t *rapid.T) {
			id, ok := mm.running(t)
			if !ok {
				t.Skip("nothing running")
			}
			due := mm.now.Add(mm.ms(t, "due", -2000, 3000))
			retried, err := claim.Fail(b.ctx, b.db, id, mm.tokens[id], claim.FailOptions{Error: "x", RetryAt: due, Now: mm.now})
			require.NoError(t, err)
			require.True(t, retried)
			delete(mm.tokens, id)
			mm.ended(t, []int64{id}, func(id int64, secs float64) { mm.m.RequeueHeld(id, due, secs) })
		},
		"setWeight": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			k := rapid.SampledFrom(mKeys[1:]).Draw(t, "key")
			w := rapid.SampledFrom([]float64{0.25, 0.5, 1, 2, 3}).Draw(t, "weight")
			b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ($1, $2, $3)
				ON CONFLICT (queue, key) DO UPDATE SET weight = EXCLUDED.weight`, q, k, w)
			mm.m.SetWeight(q, k, w)
		},
		"setModes": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			two := rapid.Bool().Draw(t, "twoLevel")
			charge := rapid.SampledFrom([]fairkeys.Charge{fairkeys.ChargeClaims, fairkeys.ChargeRuntime}).Draw(t, "charge")
			b.exec(`SELECT harvest_queue_fairness_set($1, $2, $3, 'test')`, q, two, string(charge))
			mm.m.SetTwoLevel(q, two)
			mm.m.SetCharge(q, charge)
		},
		"setGroupWeight": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			g := rapid.SampledFrom(mGroups).Draw(t, "group")
			if rapid.IntRange(0, 3).Draw(t, "clear?") == 0 {
				b.exec(`SELECT harvest_group_weight_set($1, $2, NULL, 'test')`, q, g)
				mm.m.ClearGroupWeight(q, g)
				return
			}
			w := rapid.SampledFrom([]float64{0.25, 0.5, 1, 2, 3}).Draw(t, "weight")
			b.exec(`SELECT harvest_group_weight_set($1, $2, $3, 'test')`, q, g, w)
			mm.m.SetGroupWeight(q, g, w)
		},
		"clearWeight": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			k := rapid.SampledFrom(mKeys[1:]).Draw(t, "key")
			b.exec(`DELETE FROM weight_overrides WHERE queue = $1 AND key = $2`, q, k)
			mm.m.ClearWeight(q, k)
		},
		"setQuota": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			qk := rapid.SampledFrom(mQuotaKeys[1:]).Draw(t, "quota")
			quota := fairkeys.Quota{
				MaxConcurrent: rapid.IntRange(0, 2).Draw(t, "cap"),
				Rate:          rapid.SampledFrom([]float64{0, 0.5, 1, 3}).Draw(t, "rate"),
				Burst:         rapid.SampledFrom([]float64{1, 2}).Draw(t, "burst"),
			}
			var capArg, rate, burst any
			if quota.MaxConcurrent > 0 {
				capArg = quota.MaxConcurrent
			}
			if quota.Rate > 0 {
				rate, burst = quota.Rate, quota.Burst
			}
			b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (queue, quota_key) DO UPDATE
				SET max_concurrent = EXCLUDED.max_concurrent, rate = EXCLUDED.rate, burst = EXCLUDED.burst`,
				q, qk, capArg, rate, burst)
			mm.m.SetQuota(q, qk, quota)
		},
		"clearQuota": func(t *rapid.T) {
			q := rapid.SampledFrom(mQueues).Draw(t, "queue")
			qk := rapid.SampledFrom(mQuotaKeys[1:]).Draw(t, "quota")
			b.exec(`DELETE FROM quotas WHERE queue = $1 AND quota_key = $2`, q, qk)
			b.exec(`DELETE FROM rate_buckets WHERE queue = $1 AND quota_key = $2`, q, qk)
			mm.m.ClearQuota(q, qk)
		},
		"prune": func(t *rapid.T) {
			window := mm.ms(t, "window", 0, 6000).Truncate(500 * time.Millisecond)
			preview := rapid.Bool().Draw(t, "preview")
			got, err := claim.PruneFairState(b.ctx, b.db, mm.now, window, preview)
			require.NoError(t, err)
			var want []fairkeys.StateKey
			if preview {
				want = mm.m.Clone().Prune(mm.now, window)
			} else {
				want = mm.m.Prune(mm.now, window)
			}
			// The same type; copied so that none and an empty list compare
			// alike.
			var g []fairkeys.StateKey
			g = append(g, got...)
			require.Equal(t, want, g, "prune window %v preview %v", window, preview)
			mm.stats.pruned += len(g)
		},
		"advance": func(t *rapid.T) {
			mm.now = mm.now.Add(mm.ms(t, "advance", 1, 2500))
		},
		"": func(t *rapid.T) {
			rows, err := claim.FairState(b.ctx, b.db)
			require.NoError(t, err)
			got := map[fairkeys.StateKey]fairkeys.KeyState{}
			for _, r := range rows {
				got[fairkeys.StateKey{Queue: r.Queue, Key: r.Key}] = fairkeys.KeyState{
					Pass: r.Pass, LastStart: r.LastStart, ChargedAt: r.ChargedAt.UTC()}
			}
			want := map[fairkeys.StateKey]fairkeys.KeyState{}
			for _, q := range mQueues {
				for _, k := range mKeys {
					if s, ok := mm.m.State(q, k); ok {
						s.ChargedAt = s.ChargedAt.UTC()
						want[fairkeys.StateKey{Queue: q, Key: k}] = s
					}
				}
			}
			require.Equal(t, want, got)

			// The groups' rows of two-level queues, and the runtime
			// estimates.
			grows, err := b.db.Query(b.ctx, `SELECT queue, grp, pass, last_start, charged_at FROM fair_groups WHERE pass IS NOT NULL`)
			require.NoError(t, err)
			gotG := map[fairkeys.StateKey]fairkeys.KeyState{}
			for grows.Next() {
				var k fairkeys.StateKey
				var s fairkeys.KeyState
				require.NoError(t, grows.Scan(&k.Queue, &k.Key, &s.Pass, &s.LastStart, &s.ChargedAt))
				s.ChargedAt = s.ChargedAt.UTC()
				gotG[k] = s
			}
			require.NoError(t, grows.Err())
			wantG := map[fairkeys.StateKey]fairkeys.KeyState{}
			for _, q := range mQueues {
				for _, g := range append(mGroups, fairkeys.DefaultKey) {
					if s, ok := mm.m.GroupState(q, g); ok {
						s.ChargedAt = s.ChargedAt.UTC()
						wantG[fairkeys.StateKey{Queue: q, Key: g}] = s
					}
				}
			}
			require.Equal(t, wantG, gotG, "group rows")
			erows, err := b.db.Query(b.ctx, `SELECT queue, key, held_est FROM fair_state WHERE held_est IS NOT NULL`)
			require.NoError(t, err)
			gotE := map[fairkeys.StateKey]float64{}
			for erows.Next() {
				var k fairkeys.StateKey
				var e float64
				require.NoError(t, erows.Scan(&k.Queue, &k.Key, &e))
				gotE[k] = e
			}
			require.NoError(t, erows.Err())
			wantE := map[fairkeys.StateKey]float64{}
			for _, q := range mQueues {
				for _, k := range mKeys {
					if e, ok := mm.m.HeldEstimate(q, k); ok {
						wantE[fairkeys.StateKey{Queue: q, Key: k}] = e
					}
				}
			}
			require.Equal(t, wantE, gotE, "runtime estimates")
		},
	}
}

// modelStats shows in -v output that the random runs reach the interesting
// cases.
// pinnedFirst counts batches that took rows pinned to their worker and then
// other rows.
// heldBacklog counts fair refusals whose key kept a backlog of rows of no
// quota key or another one (see modelMachine.heldBacklog).
type modelStats struct{ ok, refused, lagged, pruned, held, pinnedFirst, heldBacklog int }

// rapidSteps sets rapid's steps per check to 80 unless the command line
// chose a number, once for the package: the model tests run in parallel,
// and setting the flag from each raced with the others reading it.
func rapidSteps(t *testing.T) {
	t.Helper()
	rapidStepsOnce.Do(func() {
		if f := flag.Lookup("rapid.steps"); f != nil && f.Value.String() == f.DefValue {
			rapidStepsErr = flag.Set("rapid.steps", "80")
		}
	})
	require.NoError(t, rapidStepsErr)
}

var (
	rapidStepsOnce sync.Once
	rapidStepsErr  error
)

func TestSQLFollowsModel(t *testing.T) {
	t.Parallel()
	rapidSteps(t)
	b := setup(t)
	stats := &modelStats{}
	rapid.Check(t, func(rt *rapid.T) {
		b.exec(`TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, weight_overrides,
			weight_override_counts, quotas, rate_buckets, tenant_running, queue_fairness, group_weights, fair_groups,
			fair_held RESTART IDENTITY`)
		mm := &modelMachine{stats: stats, b: b, m: fairkeys.NewModel(), now: t0, tokens: map[int64]uuid.UUID{}}
		mm.run = b.run(runOpts{MaxAttempts: 1_000_000})
		acts := mm.actions()
		// Claims and inserts are what the test is about: give them more
		// weight than the other operations.
		acts["claim again"] = acts["claim"]
		acts["claim once more"] = acts["claim"]
		acts["insert more"] = acts["insert"]
		acts["set quota again"] = acts["setQuota"]
		acts["insert pinned more"] = acts["insertPinned"]
		acts["claim batch pinned again"] = acts["claimBatchPinned"]
		acts["insert backlog more"] = acts["insertBacklog"]
		rt.Repeat(acts)
	})
	t.Logf("claims taken %d, refusals %d, claims with lag > 0 %d, state rows pruned %d, attempts settled by runtime %d, "+
		"batches that took pinned rows and then others %d, fair refusals that held a key's backlog %d",
		stats.ok, stats.refused, stats.lagged, stats.pruned, stats.held, stats.pinnedFirst, stats.heldBacklog)
}
