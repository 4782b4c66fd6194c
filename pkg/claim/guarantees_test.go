package claim_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// The guarantees of the fair claim (pkg/fairkeys) under real concurrency:
// C claim loops (1, 4 and 16), spread over several pools as over several
// worker processes, taking single claims and batches of random sizes, while
// other goroutines start tasks, cancel tasks and complete the claimed ones.
// Each test reads the order in which the claims happened from the database
// and checks a guarantee on it.

// claimerCounts are the claim loops each guarantee is checked with: one, a
// worker's default, and many.
var claimerCounts = []int{1, 4, 16}

// atEachClaimerCount runs test in parallel subtests, one per claimer count
// c, each with a fleet of three pools of c connections.
func atEachClaimerCount(t *testing.T, test func(t *testing.T, c int, f *fleet)) {
	for _, c := range claimerCounts {
		t.Run(fmt.Sprintf("C=%d", c), func(t *testing.T) {
			t.Parallel()
			test(t, c, newFleet(t, 3, c))
		})
	}
}

// fleet is the claim side of a guarantee test: pools standing for worker
// processes, and what the claim loops took.
type fleet struct {
	t     *testing.T
	ctx   context.Context
	pools []*pgxpool.Pool
	url   string
	run   int64

	mu    sync.Mutex
	calls []claimCall

	// refused counts claim statements that a quota's recheck refused a
	// row in.
	refused atomic.Int64
}

// claimCall is one claim statement and the tasks it took, in its order.
type claimCall struct {
	started time.Time // at the client, before the statement was sent
	ids     []int64
}

// claimedTask is one claim in the order the claims happened.
type claimedTask struct {
	id      int64
	key     string
	prio    int
	started time.Time // of the statement that took it
}

func newFleet(t *testing.T, procs, conns int) *fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	f := &fleet{t: t, ctx: ctx, url: testsvc.NewDBURL(t)}
	for range procs {
		cfg, err := pgxpool.ParseConfig(f.url)
		require.NoError(t, err)
		cfg.MaxConns = int32(conns)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		f.pools = append(f.pools, p)
	}
	f.run = (&bundle{ctx: ctx, db: f.pools[0], t: t}).run(runOpts{MaxAttempts: 1000})
	return f
}

func (f *fleet) db() *pgxpool.Pool { return f.pools[0] }

// add inserts n due pending tasks of key at priority prio in one statement,
// as a group of starts does.
func (f *fleet) add(key string, prio, n int) {
	f.t.Helper()
	f.addQuota(key, "", prio, n)
}

// addQuota is add for tasks under quota key qk.
func (f *fleet) addQuota(key, qk string, prio, n int) {
	f.t.Helper()
	_, err := f.db().Exec(f.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority)
		SELECT $1, 'q', $2, $3, $4 FROM generate_series(1, $5)`, f.run, key, qk, prio, n)
	require.NoError(f.t, err)
}

// loops runs c claim loops until stop returns true or the queue runs dry.
// Each loop has its own pool (round robin) and takes single claims or
// batches of up to maxBatch, and completes what it took. Alongside, noise
// starts and cancels tasks of the keys noise names, so that writes commit
// while claims run.
func (f *fleet) loops(c, maxBatch int, noise []string, stop func() bool) {
	f.t.Helper()
	var (
		wg      sync.WaitGroup
		done    atomic.Bool
		idle    atomic.Int64
		errs    = make(chan error, c+2)
		stopped = func() bool { return done.Load() || f.ctx.Err() != nil }
	)
	for i := range c {
		db := f.pools[i%len(f.pools)]
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			req := claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour}
			for !stopped() {
				n := 1 + rng.IntN(maxBatch)
				call := claimCall{started: time.Now()}
				var rs []claim.Result
				var err error
				if n == 1 {
					var r claim.Result
					r, err = claim.Claim(f.ctx, db, req)
					rs = []claim.Result{r}
				} else {
					// Half the batches take their first rows by single
					// steps, as a worker's do after a short batch.
					req.Shallow = rng.IntN(2) == 0
					rs, err = claim.ClaimBatch(f.ctx, db, req, n)
				}
				if err != nil {
					errs <- err
					return
				}
				var took []claim.Completion
				refused := false
				for _, r := range rs {
					if r.OK {
						call.ids = append(call.ids, r.Task.ID)
						took = append(took, claim.Completion{ID: r.Task.ID, Token: r.Task.LeaseToken})
					}
					refused = refused || len(r.Refused) > 0
				}
				if refused {
					f.refused.Add(1)
				}
				if len(call.ids) == 0 {
					// A refusal is not a dry queue: the rows it held
					// back come free as the others complete theirs.
					if !refused && idle.Add(1) > int64(10*c) {
						done.Store(true)
					}
					continue
				}
				idle.Store(0)
				f.mu.Lock()
				f.calls = append(f.calls, call)
				f.mu.Unlock()
				if _, err := claim.CompleteBatch(f.ctx, db, took); err != nil {
					errs <- err
					return
				}
				if stop() {
					done.Store(true)
				}
			}
		})
	}
	if len(noise) > 0 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(1, 2))
			for !stopped() {
				key := noise[rng.IntN(len(noise))]
				if _, err := f.db().Exec(f.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key)
					SELECT $1, 'q', $2 FROM generate_series(1, $3)`, f.run, key, 1+rng.IntN(3)); err != nil {
					errs <- err
					return
				}
				// Paced, so that the noise keys stay small beside the keys
				// under test.
				time.Sleep(2 * time.Millisecond)
			}
		})
		wg.Go(func() {
			for !stopped() {
				// A cancel of a waiting task of a noise key, as a cancelled
				// run does to its task.
				if _, err := f.db().Exec(f.ctx, `UPDATE tasks SET state = 'done'
					WHERE id = (SELECT id FROM tasks WHERE queue = 'q' AND state = 'pending' AND fairness_key = ANY ($1)
					            ORDER BY random() LIMIT 1)`, noise); err != nil {
					errs <- err
					return
				}
				time.Sleep(3 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(f.t, err)
	}
}

// order returns every claim in the order the claims happened. The fair
// claims of a queue take its lock in turn, so statements do not overlap:
// the statements sort by the database time of their first lease, and each
// statement's tasks come in the order it returned them.
func (f *fleet) order() []claimedTask {
	f.t.Helper()
	var ids []int64
	for _, c := range f.calls {
		ids = append(ids, c.ids...)
	}
	rows, err := f.db().Query(f.ctx, `SELECT id, fairness_key, priority, claimed_at FROM tasks WHERE id = ANY ($1)`, ids)
	require.NoError(f.t, err)
	type info struct {
		key  string
		prio int
		at   time.Time
	}
	byID := map[int64]info{}
	for rows.Next() {
		var id int64
		var in info
		require.NoError(f.t, rows.Scan(&id, &in.key, &in.prio, &in.at))
		byID[id] = in
	}
	require.NoError(f.t, rows.Err())
	calls := slices.Clone(f.calls)
	first := func(c claimCall) time.Time {
		t := byID[c.ids[0]].at
		for _, id := range c.ids {
			if byID[id].at.Before(t) {
				t = byID[id].at
			}
		}
		return t
	}
	sort.SliceStable(calls, func(i, j int) bool { return first(calls[i]).Before(first(calls[j])) })
	var out []claimedTask
	for _, c := range calls {
		for _, id := range c.ids {
			in := byID[id]
			out = append(out, claimedTask{id: id, key: in.key, prio: in.prio, started: c.started})
		}
	}
	return out
}

// groupPending counts the pending tasks of a group's keys.
func (f *fleet) groupPending(group string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks
		WHERE queue = 'q' AND state = 'pending' AND split_part(fairness_key, '/', 1) = $1`, group).Scan(&n))
	return n
}

// setWeight sets an override as the weight API would.
func (f *fleet) setWeight(key string, w float64) {
	f.t.Helper()
	_, err := f.db().Exec(f.ctx, `INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', $1, $2)`, key, w)
	require.NoError(f.t, err)
}

func (f *fleet) pending(key string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks WHERE queue = 'q' AND fairness_key = $1 AND state = 'pending'`, key).Scan(&n))
	return n
}

// Weights: while two keys both have work, their claims divided by weight
// never drift apart by more than 1/wi + 1/wj (the spec allows C more, for
// claimers that share a snapshot; here fair claims take turns on the
// queue's lock, so there is no such slack), and weight 4 against weight 1
// gives four claims to one over the whole stretch.
func TestGuaranteeWeightsHoldAtConcurrency(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		f.setWeight("heavy", 4)
		f.add("heavy", 0, 600)
		f.add("light", 0, 300)
		f.loops(c, 8, []string{"n1", "n2", "n3"}, func() bool {
			return f.pending("heavy") == 0 || f.pending("light") == 0
		})
		got := f.order()
		checkWeights(t, got, "heavy", 4, "light", 1)
	})
}

// The weights hold among rows pinned to the claiming worker too: the
// single claim takes such rows first, by their keys' lags, and a batch
// takes them by sticky steps (harvest_claim_bulk_sticky) planned from the
// same tags, while starts and cancels of other keys commit.
func TestGuaranteeWeightsHoldForPinnedRowsAtConcurrency(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		f.setWeight("heavy", 4)
		f.addPinned("heavy", 600)
		f.addPinned("light", 300)
		f.loops(c, 8, []string{"n1", "n2", "n3"}, func() bool {
			return f.pending("heavy") == 0 || f.pending("light") == 0
		})
		got := f.order()
		checkWeights(t, got, "heavy", 4, "light", 1)
	})
}

// addPinned inserts n due pending tasks of key pinned for an hour to the
// worker the claim loops name.
func (f *fleet) addPinned(key string, n int) {
	f.t.Helper()
	_, err := f.db().Exec(f.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key, continuation, sticky_worker, sticky_until)
		SELECT $1, 'q', $2, true, 'w', now() + interval '1 hour' FROM generate_series(1, $3)`, f.run, key, n)
	require.NoError(f.t, err)
}

// checkWeights checks the pair bound over the stretch in which both keys
// had work (from the start, when both held rows, to the first one's last
// claim) and the ratio over that stretch.
func checkWeights(t *testing.T, got []claimedTask, a string, wa float64, b string, wb float64) {
	t.Helper()
	last := map[string]int{}
	for i, c := range got {
		last[c.key] = i
	}
	end := min(last[a], last[b])
	na, nb := 0, 0
	lo, hi := 0.0, 0.0
	for _, c := range got[:end] {
		switch c.key {
		case a:
			na++
		case b:
			nb++
		}
		d := float64(na)/wa - float64(nb)/wb
		lo, hi = math.Min(lo, d), math.Max(hi, d)
	}
	bound := 1/wa + 1/wb
	t.Logf("%d claims while both had work: %s %d, %s %d (ratio %.3f), spread %.3f (bound %.3f)",
		end, a, na, b, nb, float64(na)/float64(nb), hi-lo, bound)
	require.Greater(t, end, 100, "too short a stretch to judge")
	require.LessOrEqual(t, hi-lo, bound+1e-9)
	require.InDelta(t, wa/wb, float64(na)/float64(nb), 0.1*wa/wb)
}

// Priority first: no claim takes a row of lower priority while a row of
// higher priority is due and not taken. Here every high-priority row is
// there from the start, so every one of them must be claimed before the
// first low-priority row, whatever the keys' debts.
func TestGuaranteePriorityComesFirstAtConcurrency(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		// The high key weighs little, so each of its claims puts it deep
		// in debt, while the low key has none: the lag must not reorder
		// them.
		f.setWeight("high", 0.01)
		f.add("low", 0, 300)
		f.add("n1", 0, 50)
		f.add("high", 10, 300)
		f.loops(c, 8, []string{"n1", "n2"}, func() bool { return f.pending("high") == 0 && f.pending("low") < 200 })
		got := f.order()
		lastHigh, firstLow := -1, len(got)
		for i, x := range got {
			if x.prio == 10 {
				lastHigh = i
			} else if firstLow == len(got) {
				firstLow = i
			}
		}
		t.Logf("last high-priority claim %d, first low-priority claim %d of %d", lastHigh, firstLow, len(got))
		require.Equal(t, 299, lastHigh, "the high-priority rows are the first 300 claims")
		require.Equal(t, 300, firstLow)
	})
}

// The no-debt bound: a key that arrives with no debt is claimed after at
// most one claim of each other key with work, counting the claims of every
// statement sent after the key's row committed (a statement under way
// before could not see it), while floods with weights drain and other
// starts keep committing, the newcomer's own among them.
func TestGuaranteeNoDebtKeyWaitsAtMostOneClaimPerKey(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		floods := []string{"f1", "f2", "f3", "f4"}
		for i, k := range floods {
			f.setWeight(k, []float64{1, 2, 0.5, 3}[i])
			f.add(k, 0, 2000)
		}
		type arrival struct {
			key string
			id  int64
			at  time.Time
		}
		var (
			arrivals []arrival
			mu       sync.Mutex
			claimed  atomic.Int64
		)
		go func() {
			// Newcomers, one at a time, each arriving once the previous
			// one was claimed; the newcomer then starts more of its own.
			for i := range 12 {
				key := fmt.Sprintf("new%d", i)
				var id int64
				if err := f.db().QueryRow(f.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key)
					VALUES ($1, 'q', $2) RETURNING id`, f.run, key).Scan(&id); err != nil {
					return
				}
				mu.Lock()
				arrivals = append(arrivals, arrival{key, id, time.Now()})
				mu.Unlock()
				_, _ = f.db().Exec(f.ctx, `INSERT INTO tasks (run_pk, queue, fairness_key)
					SELECT $1, 'q', $2 FROM generate_series(1, 3)`, f.run, key)
				for f.ctx.Err() == nil {
					var state string
					if err := f.db().QueryRow(f.ctx, `SELECT state FROM tasks WHERE id = $1`, id).Scan(&state); err != nil || state != "pending" {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			claimed.Store(1)
		}()
		f.loops(c, 8, floods, func() bool { return claimed.Load() == 1 })
		got := f.order()
		pos := map[int64]int{}
		for i, x := range got {
			pos[x.id] = i
		}
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, arrivals, 12)
		worst := 0
		for _, a := range arrivals {
			p, ok := pos[a.id]
			require.True(t, ok, "newcomer %s was never claimed", a.key)
			waited := 0
			for _, x := range got[:p] {
				if x.started.After(a.at) {
					waited++
				}
			}
			// The other keys with work when it arrived: every key claimed
			// by a statement sent after that (a superset).
			others := map[string]bool{}
			for _, x := range got {
				if x.key != a.key && x.started.After(a.at) {
					others[x.key] = true
				}
			}
			require.LessOrEqual(t, waited, len(others), "newcomer %s waited %d claims", a.key, waited)
			worst = max(worst, waited)
		}
		t.Logf("%d newcomers, the longest waited %d claims, %d claims in all", len(arrivals), worst, len(got))
	})
}

// Idle time earns no credit: a key that was served, went idle while others
// were served, and came back with a backlog, gets from its return on no
// more than its share: against each key that stayed busy, claims divided
// by weight stay within the pair bound.
func TestGuaranteeNoBurstAfterIdle(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		f.setWeight("busy", 2)
		f.add("busy", 0, 1500)
		f.add("other", 0, 1500)
		f.add("idler", 0, 5)
		var (
			back   atomic.Bool // the idler's second visit was started
			comeMu sync.Mutex
		)
		f.loops(c, 8, []string{"n1"}, func() bool {
			if !back.Load() {
				comeMu.Lock()
				// The idler drained; it stays away for a while.
				var n int
				if !back.Load() && f.pending("idler") == 0 &&
					f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks WHERE state = 'done'`).Scan(&n) == nil && n > 400 {
					f.add("idler", 0, 400)
					back.Store(true)
				}
				comeMu.Unlock()
			}
			return back.Load() && f.pending("idler") == 0
		})
		got := f.order()
		// From the first claim of the idler's second visit on.
		first := -1
		seen := 0
		for i, x := range got {
			if x.key == "idler" {
				seen++
				if seen == 6 {
					first = i
					break
				}
			}
		}
		require.Positive(t, first, "the idler never came back")
		checkWeightsFrom(t, got[first:], "idler", 1, "busy", 2)
		checkWeightsFrom(t, got[first:], "idler", 1, "other", 1)
	})
}

// checkWeightsFrom checks only the pair bound, from the start of got.
func checkWeightsFrom(t *testing.T, got []claimedTask, a string, wa float64, b string, wb float64) {
	t.Helper()
	last := map[string]int{}
	for i, c := range got {
		last[c.key] = i
	}
	end := min(last[a], last[b])
	na, nb := 0, 0
	hi := 0.0
	for _, c := range got[:end] {
		switch c.key {
		case a:
			na++
		case b:
			nb++
		}
		hi = math.Max(hi, float64(na)/wa-float64(nb)/wb)
	}
	t.Logf("after the return: %s %d, %s %d, %s ahead by at most %.3f (bound %.3f)", a, na, b, nb, a, hi, 1/wa+1/wb)
	require.LessOrEqual(t, hi, 1/wa+1/wb+1e-9, "the returning key got a burst")
}

// Two-level: a tenant starting under 20 keys and a tenant under one share
// the queue by their group weights, within the pair bound of the groups,
// while noise keys (groups of their own) start and cancel beside them.
func TestGuaranteeTwoLevelHoldsAtConcurrency(t *testing.T) {
	t.Parallel()
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		_, err := f.db().Exec(f.ctx, `SELECT harvest_queue_fairness_set('q', true, NULL, 'test')`)
		require.NoError(t, err)
		_, err = f.db().Exec(f.ctx, `SELECT harvest_group_weight_set('q', 'many', 2, 'test')`)
		require.NoError(t, err)
		for i := range 20 {
			f.add(fmt.Sprintf("many/k%d", i), 0, 40)
		}
		f.add("one", 0, 400)
		f.loops(c, 8, []string{"n1", "n2"}, func() bool {
			return f.pending("one") == 0 || f.groupPending("many") == 0
		})
		got := f.order()
		for i := range got {
			got[i].key = fairkeys.GroupOf(got[i].key)
		}
		checkWeights(t, got, "many", 2, "one", 1)
	})
}

// Charged by runtime, one-level (batches through the fair bulk step) and
// two-level (batches through the two-level bulk step), every attempt that ended is
// settled exactly once: one fair_held row per claim taken, whatever the
// claimers, batches and noise, and none left once a last claim has folded
// them.
func TestGuaranteeRuntimeSettlesOnceAtConcurrency(t *testing.T) {
	t.Parallel()
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("two_level=%v", two), func(t *testing.T) {
			t.Parallel()
			runtimeSettlesOnce(t, two)
		})
	}
}

func runtimeSettlesOnce(t *testing.T, two bool) {
	atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
		_, err := f.db().Exec(f.ctx, `SELECT harvest_queue_fairness_set('q', $1, 'runtime', 'test')`, two)
		require.NoError(t, err)
		// Every settlement row ever written, though the claims fold them
		// away as they go.
		_, err = f.db().Exec(f.ctx, `CREATE TABLE test_held_log (task_id bigint);
			CREATE FUNCTION test_held_log() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO test_held_log VALUES (NEW.task_id); RETURN NULL; END $$;
			CREATE TRIGGER test_held_log AFTER INSERT ON fair_held FOR EACH ROW EXECUTE FUNCTION test_held_log();`)
		require.NoError(t, err)
		f.add("a/1", 0, 200)
		f.add("a/2", 0, 200)
		f.add("b", 0, 200)
		f.loops(c, 8, []string{"n1"}, func() bool { return f.pending("b") == 0 })
		got := f.order()
		var ids []int64
		for _, x := range got {
			ids = append(ids, x.id)
		}
		var logged []int64
		rows, err := f.db().Query(f.ctx, `SELECT task_id FROM test_held_log ORDER BY task_id`)
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			logged = append(logged, id)
		}
		require.NoError(t, rows.Err())
		slices.Sort(ids)
		require.Equal(t, ids, logged, "one settlement row for each claim taken, and no other")
		var billed int64
		require.NoError(t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM tasks WHERE charged_secs IS NOT NULL AND attempt > 0`).Scan(&billed))
		require.Equal(t, int64(len(got)), billed, "every fair claim billed an estimate")
		// One more fair claim folds whatever is left.
		_, err = claim.Claim(f.ctx, f.db(), claim.Request{Queue: "q", Worker: "w", Fair: true, Lease: time.Hour})
		require.NoError(t, err)
		var left int
		require.NoError(t, f.db().QueryRow(f.ctx, `SELECT count(*) FROM fair_held`).Scan(&left))
		require.Zero(t, left)
	})
}

// A capped quota at concurrency: twenty keys whose every row is under one
// quota key capped at two running tasks, beside two keys with no quota,
// while claimers take single claims and batches and other starts commit.
// The cap is never exceeded, counted at every commit that starts or ends a
// task of the quota key (not by the claim's own count), the cap is reached
// and refuses claims, and the two free keys keep their weights within the
// pair bound: the keys held back by the full quota cost the others neither
// turns nor order. One-level (the pick after a refusal walks the keys) and
// two-level (the metered keys are one tenant's group).
func TestGuaranteeQuotaCapHoldsAtConcurrency(t *testing.T) {
	t.Parallel()
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("two_level=%v", two), func(t *testing.T) {
			t.Parallel()
			atEachClaimerCount(t, func(t *testing.T, c int, f *fleet) {
				quotaCapHolds(t, c, f, two)
			})
		})
	}
}

func quotaCapHolds(t *testing.T, c int, f *fleet, two bool) {
	const capN = 2
	if two {
		_, err := f.db().Exec(f.ctx, `SELECT harvest_queue_fairness_set('q', true, NULL, 'test')`)
		require.NoError(t, err)
		_, err = f.db().Exec(f.ctx, `SELECT harvest_group_weight_set('q', 'b', 2, 'test')`)
		require.NoError(t, err)
		// Heavy enough that a batch meets more of the group's rows than
		// the cap lets run, even with one claimer.
		_, err = f.db().Exec(f.ctx, `SELECT harvest_group_weight_set('q', 'm', 8, 'test')`)
		require.NoError(t, err)
	} else {
		f.setWeight("b", 2)
	}
	_, err := f.db().Exec(f.ctx, `INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'm', $1)`, capN)
	require.NoError(t, err)
	// The running tasks of quota key m, moved by a trigger that fires at
	// each commit and takes a row lock: the commits that change the count
	// are counted in the order they commit, so the log holds the true
	// count after each of them.
	_, err = f.db().Exec(f.ctx, `CREATE TABLE test_quota_running (n integer NOT NULL);
		INSERT INTO test_quota_running VALUES (0);
		CREATE TABLE test_quota_log (n integer NOT NULL);
		CREATE FUNCTION test_quota_count() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE
			d integer := (NEW.state = 'running')::integer - (OLD.state = 'running')::integer;
			v integer;
		BEGIN
			IF d <> 0 THEN
				UPDATE test_quota_running SET n = n + d RETURNING n INTO v;
				INSERT INTO test_quota_log VALUES (v);
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER test_quota_count AFTER UPDATE ON tasks
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
			WHEN (NEW.quota_key = 'm') EXECUTE FUNCTION test_quota_count();`)
	require.NoError(t, err)
	for i := range 20 {
		f.addQuota(fmt.Sprintf("m/%d", i), "m", 0, 30)
	}
	f.add("a", 0, 300)
	f.add("b", 0, 600)
	f.loops(c, 8, []string{"n1", "n2"}, func() bool {
		return f.pending("a") == 0 || f.pending("b") == 0
	})
	got := f.order()
	metered := 0
	for _, x := range got {
		if strings.HasPrefix(x.key, "m/") {
			metered++
		}
	}
	var most, changes int
	require.NoError(t, f.db().QueryRow(f.ctx, `SELECT coalesce(max(n), 0), count(*) FROM test_quota_log`).Scan(&most, &changes))
	t.Logf("%d claims, %d of them metered; %d statements refused a row; the running count moved %d times, at most %d (cap %d)",
		len(got), metered, f.refused.Load(), changes, most, capN)
	require.LessOrEqual(t, most, capN, "more tasks of the quota key ran at once than its cap")
	require.Equal(t, capN, most, "the cap was never reached: the test did not test it")
	require.Positive(t, f.refused.Load(), "no claim was refused: the test did not test the refusal")
	require.Positive(t, metered, "the metered keys were never served")
	if two {
		for i := range got {
			got[i].key = fairkeys.GroupOf(got[i].key)
		}
	}
	checkWeights(t, got, "b", 2, "a", 1)
}
