package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// groupRow is a group's row of a two-level queue as stored.
type groupRow struct {
	Grp       string
	Pass      *float64
	LastStart *float64
	ChargedAt *time.Time
	KeyClock  float64
}

// twoLevelState is everything a claim of a two-level queue writes besides
// the rows it leases: the keys' states and heads, the groups' rows, both
// clocks and the rate buckets.
type twoLevelState struct {
	Keys       []claim.StateRow
	Summaries  []keySummary
	Groups     []groupRow
	Clock      float64
	GroupClock float64
	Buckets    []string
}

func (b *bundle) twoLevelState(t require.TestingT) twoLevelState {
	var s twoLevelState
	var err error
	s.Keys, err = claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	s.Summaries = b.summaries()
	rows, err := b.db.Query(b.ctx, `SELECT grp, pass, last_start, charged_at, key_clock FROM fair_groups
		WHERE queue = 'q' ORDER BY grp`)
	require.NoError(t, err)
	s.Groups, err = pgx.CollectRows(rows, pgx.RowToStructByPos[groupRow])
	require.NoError(t, err)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT harvest_clock('q'),
		coalesce((SELECT group_clock FROM fair_queues WHERE queue = 'q'), 0)`).Scan(&s.Clock, &s.GroupClock))
	rows, err = b.db.Query(b.ctx, `SELECT quota_key || ':' || tokens || '@' || updated_at FROM rate_buckets ORDER BY quota_key`)
	require.NoError(t, err)
	s.Buckets, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return s
}

// calls counts the PL/pgSQL calls of fn made on conn so far (its session
// must have track_functions = 'pl'); the statistics are flushed at the end
// of the transaction after pg_stat_force_next_flush.
func calls(t require.TestingT, b *bundle, conn *pgxpool.Conn, fn string) int {
	_, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
		WHERE funcname = $1`, fn).Scan(&n))
	return n
}

// A batch in a two-level queue is planned in bulk steps
// (harvest_claim_bulk_group): for random backlogs over groups and their
// keys (group and key weights, debts of both, priorities, continuations,
// quota keys with caps and buckets, rows pinned to the claiming worker or
// to another, per claim or by runtime) a batch of n must give exactly
// what n single claims give on a twin database: the same rows in the same
// order, the same lags and refusals, the same key states, heads and debt
// marks, group rows, clocks and buckets. The test also checks that bulk
// steps took rows, and counts the batches taken without a single step.
func TestTwoLevelBulkPlanMatchesSingleClaims(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	conn, err := batch.db.Acquire(batch.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(batch.ctx, `SET track_functions = 'pl'`)
	require.NoError(t, err)
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Now: t0.Add(time.Hour), Lease: time.Minute}
	var bulkRows, wholeBulk, batches, rowsTaken int

	rapid.Check(t, func(rt *rapid.T) {
		charge := rapid.SampledFrom([]string{"claims", "runtime"}).Draw(rt, "charge")
		for _, b := range []*bundle{single, batch} {
			b.exec(`TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, weight_overrides,
				weight_override_counts, quotas, rate_buckets, tenant_running, queue_fairness, group_weights,
				fair_groups, fair_held RESTART IDENTITY`)
			b.exec(`SELECT harvest_queue_fairness_set('q', true, $1, 'test')`, charge)
		}
		groups := rapid.IntRange(1, 6).Draw(rt, "groups")
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
		var keys []string
		for g := range groups {
			grp := fmt.Sprintf("g%d", g)
			if g == 0 && rapid.IntRange(0, 3).Draw(rt, "default group") == 0 {
				grp = ""
			}
			if grp != "" && rapid.Bool().Draw(rt, "group weight") {
				w := rapid.SampledFrom([]float64{0.5, 2, 3}).Draw(rt, "group weight value")
				for _, b := range []*bundle{single, batch} {
					b.exec(`SELECT harvest_group_weight_set('q', $1, $2, 'test')`, grp, w)
				}
			}
			if grp == "" {
				keys = append(keys, "")
				continue
			}
			// The group's own key, and sub-keys.
			if rapid.Bool().Draw(rt, "group key") {
				keys = append(keys, grp)
			}
			for k := range rapid.IntRange(0, 5).Draw(rt, "sub-keys") {
				keys = append(keys, fmt.Sprintf("%s/k%d", grp, k))
			}
		}
		for _, key := range keys {
			if key != "" && rapid.IntRange(0, 3).Draw(rt, "override") == 0 {
				w := rapid.SampledFrom([]float64{0.5, 2, 3, 10}).Draw(rt, "weight")
				for _, b := range []*bundle{single, batch} {
					b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', $1, $2)`, key, w)
				}
			}
			for range rapid.IntRange(0, 12).Draw(rt, "rows") {
				r := row{key: key, due: t0.Add(time.Duration(rapid.IntRange(0, 60).Draw(rt, "due")) * time.Second)}
				if rapid.IntRange(0, 4).Draw(rt, "prio") == 0 {
					r.prio = 1
				}
				r.cont = rapid.IntRange(0, 9).Draw(rt, "cont") == 0
				switch rapid.IntRange(0, 11).Draw(rt, "quota") {
				case 0:
					r.quota = "x"
				case 1:
					r.quota = "y"
				}
				if rapid.IntRange(0, 11).Draw(rt, "pinned") == 0 {
					r.pin = rapid.SampledFrom([]string{"w", "v"}).Draw(rt, "pin")
					r.pinUntil = req.Now.Add(time.Duration(rapid.IntRange(-2, 8).Draw(rt, "pin for")) * time.Minute)
				}
				rows = append(rows, r)
			}
		}
		for _, qk := range []string{"x", "y"} {
			drawQuota(rt, []*bundle{single, batch}, qk, 6, 0)
		}
		order := rapid.Permutation(rows).Draw(rt, "order")
		for _, r := range order {
			for i, b := range []*bundle{single, batch} {
				b.task(taskOpts{RunPK: run[i], Key: r.key, QuotaKey: r.quota, Priority: r.prio,
					Continuation: r.cont, DueAt: r.due, StickyWorker: r.pin, StickyUntil: r.pinUntil,
					Now: t0.Add(time.Hour)})
			}
		}
		// Some single claims first, so that groups and keys carry debt and
		// the clocks moved; in a runtime queue, estimates of their own for
		// some keys (as ended attempts would leave them).
		for range rapid.IntRange(0, 12).Draw(rt, "before") {
			a, b := single.claim(req), batch.claim(req)
			require.Equal(rt, a.Task.ID, b.Task.ID)
		}
		// Ordinary claims take rows without the fair lock: the heads they
		// took are stale in the summary until a fair claim repairs them.
		ordinary := req
		ordinary.Fair = false
		for range rapid.IntRange(0, 3).Draw(rt, "ordinary") {
			a, b := single.claim(ordinary), batch.claim(ordinary)
			require.Equal(rt, a.Task.ID, b.Task.ID)
		}
		if charge == "runtime" {
			for _, key := range keys {
				if rapid.Bool().Draw(rt, "estimate") {
					est := rapid.SampledFrom([]float64{0.25, 0.5, 2, 3}).Draw(rt, "estimate value")
					for _, b := range []*bundle{single, batch} {
						b.exec(`UPDATE fair_state SET held_est = $2 WHERE queue = 'q' AND key = $1`, key, est)
					}
				}
			}
		}
		n := rapid.IntRange(2, 24).Draw(rt, "n")
		bulk0, steps0 := calls(rt, batch, conn, "harvest_claim_bulk_group"), calls(rt, batch, conn, "harvest_claim_step")
		got, err := claim.ClaimBatch(batch.ctx, conn, req, n)
		require.NoError(rt, err)
		bulk, steps := calls(rt, batch, conn, "harvest_claim_bulk_group")-bulk0, calls(rt, batch, conn, "harvest_claim_step")-steps0
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
		}
		require.Equal(rt, single.twoLevelState(rt), batch.twoLevelState(rt))
		batches++
		rowsTaken += len(got)
		if bulk > 0 {
			bulkRows += len(got) - steps
			if steps == 0 && len(got) > 0 {
				wholeBulk++
			}
		}
	})
	t.Logf("batches %d, rows taken %d, of which by bulk steps %d; batches without a single step %d",
		batches, rowsTaken, bulkRows, wholeBulk)
	require.Positive(t, bulkRows, "no row was taken by a two-level bulk step")
	require.Positive(t, wholeBulk, "no two-level batch was taken by bulk steps alone")
}

// A two-level batch over tenants with sub-keys and group weights, where
// every group and key has work, is taken by bulk steps alone, and gives
// what the reference model's single claims give, row by row.
func TestTwoLevelBatchTakesBulkSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, `SET track_functions = 'pl'`)
	require.NoError(t, err)
	m := fairkeys.NewModel()
	m.SetTwoLevel("q", true)
	b.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'test')`)
	b.exec(`SELECT harvest_group_weight_set('q', 'acme', 3, 'test')`)
	m.SetGroupWeight("q", "acme", 3)
	b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'acme/k1', 2)`)
	m.SetWeight("q", "acme/k1", 2)
	run := b.run(runOpts{MaxAttempts: 100})
	keys := []string{"acme/k0", "acme/k1", "acme/k2", "acme/k3", "globex", "initech/a", "initech/b", "umbrella"}
	for i := range 240 {
		task := fairkeys.Task{Queue: "q", Key: keys[(i*7)%len(keys)],
			DueAt: t0.Add(time.Duration(i) * time.Second)}
		task.ID = b.task(taskOpts{RunPK: run, Key: task.Key, DueAt: task.DueAt, Now: t0.Add(time.Hour)})
		m.Insert(task)
	}
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Now: t0.Add(time.Hour), Lease: time.Minute}
	mreq := fairkeys.ClaimRequest{Queue: "q", Worker: "w", Fair: true, Now: req.Now}
	for batchNo := range 4 {
		got, err := claim.ClaimBatch(b.ctx, conn, req, 50)
		require.NoError(t, err)
		require.Len(t, got, 50)
		for i, g := range got {
			w := m.Claim(mreq)
			require.True(t, w.OK)
			require.Equal(t, w.Task.ID, g.Task.ID, "batch %d row %d", batchNo, i)
			require.Equal(t, w.Lag, g.Lag, "batch %d row %d", batchNo, i)
		}
		for _, k := range keys {
			s, ok := m.State("q", k)
			require.True(t, ok)
			var pass, last float64
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pass, last_start FROM fair_state WHERE queue = 'q' AND key = $1`,
				k).Scan(&pass, &last))
			require.Equal(t, s.Pass, pass, "pass of %s", k)
			require.Equal(t, s.LastStart, last, "last start of %s", k)
		}
		for _, g := range []string{"acme", "globex", "initech", "umbrella"} {
			s, ok := m.GroupState("q", g)
			require.True(t, ok)
			var pass, last float64
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pass, last_start FROM fair_groups WHERE queue = 'q' AND grp = $1`,
				g).Scan(&pass, &last))
			require.Equal(t, s.Pass, pass, "pass of group %s", g)
			require.Equal(t, s.LastStart, last, "last start of group %s", g)
		}
	}
	steps, bulk := calls(t, b, conn, "harvest_claim_step"), calls(t, b, conn, "harvest_claim_bulk_group")
	t.Logf("4 batches of 50: %d single steps, %d bulk steps", steps, bulk)
	require.Zero(t, steps, "a two-level batch took single steps")
	require.Positive(t, bulk)
}

// A refused head in a two-level queue keeps the batch on the bulk path: the
// head of key acme/a carries a quota key whose cap is full, so every claim
// that reaches it refuses it, and the claims of its group go to acme/b and
// acme/c. The bulk step leaves acme/a out of its replay and reports the
// refusal on each row whose single claim would reach the head first, so the
// batch gives the model's single claims, refusals included, with no single
// step. (The bulk step used to end its plan before the refused row and was
// not asked again after a claim that refused: the rest of each batch took
// single steps, 14 in the first batch of 30 and 20 in the second.)
func TestTwoLevelBatchRefusedHeadStaysInBulk(t *testing.T) {
	t.Parallel()
	tw := newRefusedHeadTwin(t)
	tw.twoLevel()
	conn, steps := tw.capFull(t)
	tw.add("acme/a", "capped", 0, 1, "")
	tw.add("acme/a", "", 0, 2, "")
	// Eight rows of each other key, due before the claims' time (a
	// minute after t0); rows of one due time go by id.
	for i, key := range []string{"acme/b", "acme/c", "g0/k0", "g0/k1", "g1/k0", "g1/k1", "g1/k2", "g2", "g3/k0"} {
		for j := range 8 {
			tw.add(key, "", 0, 10+i+j, "")
		}
	}
	before := steps()
	got := tw.batchOn(t, conn, tw.req(true, "w1", 0), 30)
	require.Len(t, got, 30)
	refused := 0
	for _, g := range got {
		if len(g.Refused) > 0 {
			refused++
		}
	}
	require.Positive(t, refused, "some rows carry the refusal of acme/a's head")
	first := steps() - before
	// The second batch is a statement of its own: it meets the refused head
	// again with no refusals to start from.
	got = tw.batchOn(t, conn, tw.req(true, "w1", 0), 30)
	require.Len(t, got, 30)
	second := steps() - before - first
	t.Logf("single steps: %d in the first batch of 30, %d in the second", first, second)
	require.LessOrEqual(t, first, 2, "the first batch stays on bulk steps")
	require.LessOrEqual(t, second, 2, "the second batch stays on bulk steps")
}
