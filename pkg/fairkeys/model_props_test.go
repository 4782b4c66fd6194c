package fairkeys

// Property tests of the fairness guarantees, run on the Model. Unless a test
// says otherwise, every task has the same priority, no stickiness, no
// ageing, no quota and the first-task band, so that only the lag (and the
// due-time/ID tie-break) decides: the guarantees are about fairness between
// keys, and the other sort terms deliberately outrank it.

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

const propQueue = "q"

// sim drives a Model with a clock that moves one second per claim, so tasks
// inserted later always have a later due time and a larger ID.
type sim struct {
	m      *Model
	now    time.Time
	nextID int64
	pend   map[string]int // pending tasks per key, kept in step with m
}

func newSim() *sim { return &sim{m: NewModel(), now: t0, pend: map[string]int{}} }

// add inserts n due tasks for key and returns the ID of the first.
func (s *sim) add(key string, n int) int64 {
	first := s.nextID + 1
	for range n {
		s.nextID++
		s.m.Insert(Task{ID: s.nextID, Queue: propQueue, Key: key, DueAt: s.now})
	}
	s.pend[key] += n
	return first
}

func (s *sim) req(worker string) ClaimRequest {
	return ClaimRequest{Queue: propQueue, Worker: worker, Now: s.now, Fair: true}
}

func (s *sim) claim() ClaimResult {
	s.now = s.now.Add(time.Second)
	return s.took(s.m.Claim(s.req("w0")))
}

func (s *sim) took(r ClaimResult) ClaimResult {
	if r.OK {
		s.pend[r.Task.Key]--
	}
	return r
}

// round runs the claims of c claim loops that all want a task at once:
// their fair claims take the queue's fair lock one after the other, so they
// are c claims in a row, each against what the ones before it charged.
func (s *sim) round(c int) []ClaimResult {
	s.now = s.now.Add(time.Second)
	rs := make([]ClaimResult, c)
	for i := range rs {
		rs[i] = s.took(s.m.Claim(s.req(fmt.Sprintf("w%d", i))))
	}
	return rs
}

// pendingByKey returns the live per-key pending counts (not a copy).
func (s *sim) pendingByKey() map[string]int { return s.pend }

// weightGen favours the extremes and 1, where bugs in 1/w tend to show.
var weightGen = rapid.OneOf(
	rapid.SampledFrom([]float64{MinWeight, 0.1, 0.5, 1, 1, 2, 3, 10, MaxWeight}),
	rapid.Float64Range(MinWeight, MaxWeight),
)

func drawWeights(t *rapid.T, m *Model, keys []string) map[string]float64 {
	w := map[string]float64{}
	for _, k := range keys {
		if rapid.Bool().Draw(t, "override_"+k) {
			m.SetWeight(propQueue, k, weightGen.Draw(t, "w_"+k))
		}
		w[k] = m.Weight(propQueue, k)
	}
	return w
}

func keyNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// tol absorbs float64 rounding in sums of 1/w terms of size up to about x.
func tol(x float64) float64 { return 1e-9 * (1 + math.Abs(x)) }

// A key that becomes pending at lag 0 (brand new, or back with pass <= V)
// is claimed after at most one claim of each OTHER key that had pending work
// when it arrived, however big their backlogs and whatever the weights.
//
// Why weights do not enter the bound: a claim at lag 0 leaves the key with
// pass = V + 1/w > V for every weight in range, so that key no longer ties
// with the waiting one; and V cannot move while some key sits at lag 0,
// because the claim always takes a lag-0 key first. So each other key gets
// at most one claim, and keys that arrive later lose the lag-0 tie on due
// time. (Exactness needs V + 1/MaxWeight > V, i.e. V below ~1e12, which
// any realistic queue is.)
func TestPropertyNoDebtKeyWaitsAtMostOneClaimPerActiveKey(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		keys := append(keyNames("k", rapid.IntRange(1, 6).Draw(rt, "others")), DefaultKey)
		drawWeights(rt, s.m, keys)
		s.add(keys[0], rapid.IntRange(1, 3000).Draw(rt, "flood"))
		for _, k := range keys[1:] {
			s.add(k, rapid.IntRange(0, 20).Draw(rt, "backlog"))
		}
		for range rapid.IntRange(0, 80).Draw(rt, "history") {
			if rapid.Bool().Draw(rt, "insert") {
				s.add(rapid.SampledFrom(keys).Draw(rt, "key"), rapid.IntRange(1, 5).Draw(rt, "n"))
			} else {
				s.claim()
			}
		}

		// The newcomer: a fresh key, or a known key that is idle with no debt.
		pend := s.pendingByKey()
		target := "newcomer"
		var idle []string
		for _, k := range keys {
			if pend[k] == 0 && s.m.Lag(propQueue, k) == 0 {
				idle = append(idle, k)
			}
		}
		if len(idle) > 0 && rapid.Bool().Draw(rt, "returning") {
			target = rapid.SampledFrom(idle).Draw(rt, "target")
		}
		require.Zero(rt, s.m.Lag(propQueue, target))
		active := 0
		for k, n := range pend {
			if n > 0 && k != target {
				active++
			}
		}
		id := s.add(target, rapid.IntRange(1, 3).Draw(rt, "target_tasks"))

		for waited := 0; ; waited++ {
			// Arrivals and weight changes while it waits change nothing.
			if rapid.Bool().Draw(rt, "arrival") {
				k := rapid.SampledFrom(append(keys, "late")).Draw(rt, "arriving")
				s.add(k, rapid.IntRange(1, 50).Draw(rt, "arriving_n"))
			}
			if rapid.IntRange(0, 4).Draw(rt, "reweigh") == 0 {
				s.m.SetWeight(propQueue, rapid.SampledFrom(keys).Draw(rt, "rekey"), weightGen.Draw(rt, "rew"))
			}
			r := s.claim()
			require.True(rt, r.OK)
			if r.Task.ID == id {
				break
			}
			require.Less(rt, waited, active, "%q waited %d claims with %d other active keys", target, waited+1, active)
		}
	})
}

// stepLog records, for each claim, which keys were backlogged (held a due
// pending task) just before it, and the cumulative claims per key after it.
type stepLog struct {
	backlogged []map[string]bool
	cum        []map[string]int // cum[0] is all zeros; cum[i+1] after claim i
}

func (l *stepLog) record(s *sim) ClaimResult {
	b := map[string]bool{}
	for k, n := range s.pendingByKey() {
		b[k] = n > 0
	}
	if len(l.cum) == 0 {
		l.cum = append(l.cum, map[string]int{})
	}
	r := s.claim()
	next := map[string]int{}
	for k, v := range l.cum[len(l.cum)-1] {
		next[k] = v
	}
	if r.OK {
		next[r.Task.Key]++
	}
	l.backlogged = append(l.backlogged, b)
	l.cum = append(l.cum, next)
	return r
}

// checkPairBound requires that over every window of claims during which
// both i and j were backlogged, their claims divided by weight differ by at
// most 1/wi + 1/wj. A window [a, b) is checked through prefix sums, so it
// is enough that max - min of the difference over the run stays in bound.
func checkPairBound(t require.TestingT, l *stepLog, i, j string, wi, wj float64) {
	bound := 1/wi + 1/wj
	n := len(l.backlogged)
	for a := 0; a < n; {
		if !l.backlogged[a][i] || !l.backlogged[a][j] {
			a++
			continue
		}
		b := a
		for b < n && l.backlogged[b][i] && l.backlogged[b][j] {
			b++
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for p := a; p <= b; p++ {
			d := float64(l.cum[p][i])/wi - float64(l.cum[p][j])/wj
			lo, hi = math.Min(lo, d), math.Max(hi, d)
		}
		require.LessOrEqual(t, hi-lo, bound+tol(hi-lo),
			"keys %q (w=%v) and %q (w=%v), claims %d..%d: spread %v > %v", i, wi, j, wj, a, b, hi-lo, bound)
		a = b
	}
}

// While two keys both have work, claims/weight of one never gets ahead of
// the other's by more than 1/wi + 1/wj, over any such window.
func TestPropertyBackloggedKeysStayWithinBound(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		keys := append(keyNames("k", rapid.IntRange(1, 4).Draw(rt, "keys")), DefaultKey)
		w := drawWeights(rt, s.m, keys)
		steps := rapid.IntRange(50, 400).Draw(rt, "steps")
		for _, k := range keys {
			s.add(k, rapid.IntRange(0, steps).Draw(rt, "backlog"))
		}
		var l stepLog
		for range steps {
			if rapid.IntRange(0, 3).Draw(rt, "arrive") == 0 {
				s.add(rapid.SampledFrom(keys).Draw(rt, "key"), rapid.IntRange(1, 10).Draw(rt, "n"))
			}
			l.record(s)
		}
		for x, i := range keys {
			for _, j := range keys[x+1:] {
				checkPairBound(rt, &l, i, j, w[i], w[j])
			}
		}
	})
}

// A key that was idle while others were served comes back at the clock,
// not at its old pass: from its return on, it never gets ahead of a key
// that stayed backlogged all along by more than the pair bound, however
// long it was away. A scheduler that let idle time accrue credit would hand
// it a burst proportional to the idle stretch.
func TestPropertyIdleTimeEarnsNoCredit(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		keys := []string{"idler", "steady", "other"}
		w := drawWeights(rt, s.m, keys)
		first := rapid.IntRange(1, 5).Draw(rt, "first_visit")
		idleFor := rapid.IntRange(1, 400).Draw(rt, "idle_claims")
		back := rapid.IntRange(1, 300).Draw(rt, "return_backlog")
		post := rapid.IntRange(1, 200).Draw(rt, "post_claims")
		const drainCap = 100
		s.add("steady", drainCap+idleFor+post+1)
		if rapid.Bool().Draw(rt, "third_key") {
			s.add("other", drainCap+idleFor+post+1)
		}
		firstID := s.add("idler", first)

		// First visit: serve the idler until it runs dry. Against a much
		// heavier key that can take very long, so whatever is left after
		// the cap goes through the dispatch channel, which charges the same.
		for range drainCap {
			if s.pendingByKey()["idler"] == 0 {
				break
			}
			s.claim()
		}
		for id := firstID; id < firstID+int64(first); id++ {
			if s.m.TaskState(id) == TaskPending {
				s.now = s.now.Add(time.Second)
				require.True(rt, s.took(s.m.ClaimByID(id, s.req("w0"))).OK)
			}
		}
		for range idleFor {
			require.NotEqual(rt, "idler", s.claim().Task.Key)
		}

		s.add("idler", back)
		require.GreaterOrEqual(rt, s.m.Lag(propQueue, "idler"), 0.0)
		var nIdler, nSteady int
		for range post {
			pend := s.pendingByKey()
			if pend["idler"] == 0 || pend["steady"] == 0 {
				break
			}
			switch s.claim().Task.Key {
			case "idler":
				nIdler++
			case "steady":
				nSteady++
			}
			ahead := float64(nIdler)/w["idler"] - float64(nSteady)/w["steady"]
			bound := 1/w["idler"] + 1/w["steady"]
			require.LessOrEqual(rt, ahead, bound+tol(ahead),
				"returning key got %d claims against %d of a steady key (weights %v, %v)",
				nIdler, nSteady, w["idler"], w["steady"])
		}
	})
}

// Pruning an idle key's row forgives its debt, but that debt is never more
// than one claim at the weight of its last charge (pass - V <= 1/w), and
// prune keeps the clock row, so the clock of a live queue never goes
// back. Only a wholly idle queue is reset. The test replays random histories over two
// queues and checks every prune against the rules.
func TestPropertyPruneLosesAtMostOneClaimOfDebt(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		m := NewModel()
		queues := []string{"q1", "q2"}
		keys := []string{DefaultKey, "a", "b", "c", "d"}
		now := t0
		var nextID int64
		lastW := map[StateKey]float64{}
		var running []int64

		for range rapid.IntRange(1, 300).Draw(rt, "ops") {
			q := rapid.SampledFrom(queues).Draw(rt, "queue")
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2:
				nextID++
				delay := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5, 60}).Draw(rt, "delay")) * time.Second
				m.Insert(Task{ID: nextID, Queue: q, Key: rapid.SampledFrom(keys).Draw(rt, "key"), DueAt: now.Add(delay)})
			case 3, 4, 5:
				r := m.Claim(ClaimRequest{Queue: q, Worker: "w", Now: now, Fair: true})
				if r.OK {
					running = append(running, r.Task.ID)
					sk := StateKey{q, r.Task.Key}
					lastW[sk] = m.Weight(q, r.Task.Key)
					st, _ := m.State(q, r.Task.Key)
					require.LessOrEqual(rt, st.Pass-m.Clock(q), 1/lastW[sk]+tol(st.Pass))
				}
			case 6:
				if len(running) > 0 {
					i := rapid.IntRange(0, len(running)-1).Draw(rt, "done")
					m.Complete(running[i])
					running = append(running[:i], running[i+1:]...)
				}
			case 7:
				if k := rapid.SampledFrom(keys[1:]).Draw(rt, "wkey"); rapid.Bool().Draw(rt, "clear") {
					m.ClearWeight(q, k)
				} else {
					m.SetWeight(q, k, weightGen.Draw(rt, "w"))
				}
			case 8:
				now = now.Add(time.Duration(rapid.IntRange(0, 30).Draw(rt, "advance")) * time.Second)
			case 9:
				window := time.Duration(rapid.IntRange(0, 60).Draw(rt, "window")) * time.Second
				checkPrune(rt, m, now, window, lastW)
			}
		}
	})
}

func checkPrune(t *rapid.T, m *Model, now time.Time, window time.Duration, lastW map[StateKey]float64) {
	before := copyStates(m.states)
	clocks := map[string]float64{}
	hasPending := map[StateKey]bool{}
	for q := range before {
		clocks[q] = m.Clock(q)
		for _, r := range m.pending[q] {
			hasPending[StateKey{q, r.t.Key}] = true
		}
	}
	deleted := m.Prune(now, window)
	require.True(t, sort.SliceIsSorted(deleted, func(i, j int) bool {
		a, b := deleted[i], deleted[j]
		return a.Queue < b.Queue || (a.Queue == b.Queue && a.Key < b.Key)
	}))
	cutoff := now.Add(-window)
	for _, sk := range deleted {
		old, ok := before[sk.Queue][sk.Key]
		require.True(t, ok, "deleted a row that did not exist: %v", sk)
		_, still := m.State(sk.Queue, sk.Key)
		require.False(t, still)
		require.False(t, hasPending[sk], "deleted the row of a key with pending work: %v", sk)
		require.False(t, old.ChargedAt.After(cutoff), "deleted a recent row: %v", sk)
		if _, live := m.states[sk.Queue]; !live {
			continue // the whole queue went idle: every debt is forgiven
		}
		debt := math.Max(0, old.Pass-clocks[sk.Queue])
		require.LessOrEqual(t, debt, 1/lastW[sk]+tol(old.Pass),
			"pruning %v forgave %v, more than one claim at weight %v", sk, debt, lastW[sk])
	}
	for q, rows := range before {
		if _, live := m.states[q]; !live {
			for sk := range hasPending {
				require.NotEqual(t, q, sk.Queue, "reset queue %q that had pending work", q)
			}
			continue
		}
		require.Equal(t, clocks[q], m.Clock(q), "the clock of live queue %q moved", q)
		for k, st := range rows {
			_, kept := m.State(q, k)
			if hasPending[StateKey{q, k}] || st.ChargedAt.After(cutoff) {
				require.True(t, kept, "dropped a row prune must keep: %q/%q", q, k)
			}
		}
	}
}

// With one backlogged key and a stream of new keys, each arriving with one
// task and never two arrivals in a row (between any two consecutive claims
// at most one of the two gaps brings a newcomer), the newcomers take only
// the one claim each needs and the backlogged key gets at least every other
// claim, whatever its weight. The backlogged key is charged once first: a
// key still at lag 0 ties with newcomers and wins on due time, so the
// alternation is only exact once it holds a row.
func TestPropertyNewKeysTakeOnlyWhatTheyNeed(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		steps := rapid.IntRange(10, 1500).Draw(rt, "steps")
		s.add("big", steps+1)
		if rapid.Bool().Draw(rt, "override") {
			s.m.SetWeight(propQueue, "big", weightGen.Draw(rt, "w"))
		}
		require.Equal(t, "big", s.claim().Task.Key)

		prevArrived, prevNew := false, false
		waiting := map[string]bool{}
		for i := range steps {
			arrive := !prevArrived && rapid.Bool().Draw(rt, "arrive")
			if arrive {
				k := fmt.Sprintf("new%d", i)
				if rapid.IntRange(0, 3).Draw(rt, "newcomer_override") == 0 {
					s.m.SetWeight(propQueue, k, weightGen.Draw(rt, "new_w"))
				}
				s.add(k, 1)
				waiting[k] = true
				// It joins at the clock: no credit to spend, no debt to pay.
				require.Zero(rt, s.m.Lag(propQueue, k))
			}
			prevArrived = arrive
			r := s.claim()
			require.True(rt, r.OK)
			isNew := r.Task.Key != "big"
			require.False(rt, isNew && prevNew, "claim %d: two newcomers in a row", i)
			if isNew {
				require.True(rt, waiting[r.Task.Key])
				delete(waiting, r.Task.Key)
			}
			require.LessOrEqual(rt, len(waiting), 1, "a newcomer was left waiting")
			prevNew = isNew
		}
	})
}

// With C claim loops, and arrivals and weight changes only between their
// rounds, a key with no debt still waits at most one claim per other active
// key: the spec allows C - 1 more, for claimers that pick from one snapshot,
// but fair claims of a queue take its lock in turn, so none of them picks
// from a stale one. Any number of floods and light keys, any weights.
func TestPropertyConcurrentClaimersBound(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		c := rapid.IntRange(1, 6).Draw(rt, "claimers")
		keys := append(keyNames("k", rapid.IntRange(1, 6).Draw(rt, "keys")), DefaultKey)
		drawWeights(rt, s.m, keys)
		// Backlogs are light (a few tasks) or floods, in any mix.
		size := rapid.OneOf(rapid.IntRange(1, 3), rapid.IntRange(50, 1500))
		for _, k := range keys {
			if rapid.IntRange(0, 3).Draw(rt, "starts_empty") > 0 {
				s.add(k, size.Draw(rt, "backlog"))
			}
		}
		arrive := func() {
			if rapid.Bool().Draw(rt, "arrival") {
				k := rapid.SampledFrom(append(keys, "late")).Draw(rt, "arriving")
				s.add(k, size.Draw(rt, "arriving_n"))
			}
		}
		for range rapid.IntRange(0, 40).Draw(rt, "history_rounds") {
			arrive()
			exactRound(rt, s, c)
		}

		// The waiting key: a fresh one, or a known one that is idle with no debt.
		pend := s.pendingByKey()
		target := "newcomer"
		var idle []string
		for _, k := range keys {
			if pend[k] == 0 && s.m.Lag(propQueue, k) == 0 {
				idle = append(idle, k)
			}
		}
		if len(idle) > 0 && rapid.Bool().Draw(rt, "returning") {
			target = rapid.SampledFrom(idle).Draw(rt, "target")
		}
		require.Zero(rt, s.m.Lag(propQueue, target))
		active := 0
		for k, n := range pend {
			if n > 0 && k != target {
				active++
			}
		}
		s.add(target, rapid.IntRange(1, 3).Draw(rt, "target_tasks"))

		waited := 0
		for served := false; !served; {
			arrive()
			if rapid.IntRange(0, 4).Draw(rt, "reweigh") == 0 {
				s.m.SetWeight(propQueue, rapid.SampledFrom(keys).Draw(rt, "rekey"), weightGen.Draw(rt, "rew"))
			}
			for _, r := range exactRound(rt, s, c) {
				require.True(rt, r.OK)
				if r.Task.Key == target {
					served = true
					break
				}
				waited++
			}
			require.LessOrEqual(rt, waited, active,
				"%q waited %d claims: %d other active keys, %d claimers", target, waited, active, c)
		}
	})
}

// exactRound runs one round of c claimers and checks that every claim was
// charged in full: a key claimed n times in the round has its pass moved at
// least n/w past where its next start stood before the round.
func exactRound(t *rapid.T, s *sim, c int) []ClaimResult {
	v := s.m.Clock(propQueue)
	before := map[string]float64{}
	for k, st := range s.m.states[propQueue] {
		before[k] = math.Max(st.Pass, v)
	}
	rs := s.round(c)
	n := map[string]int{}
	for _, r := range rs {
		if r.OK {
			n[r.Task.Key]++
		}
	}
	for k, cnt := range n {
		start, ok := before[k]
		if !ok {
			start = v
		}
		st, _ := s.m.State(propQueue, k)
		want := start + float64(cnt)/s.m.Weight(propQueue, k)
		require.GreaterOrEqual(t, st.Pass, want-tol(want), "key %q claimed %d times in a round but charged short", k, cnt)
	}
	return rs
}

// The scenario that holds a newcomer back when claimers pick from one
// snapshot and skip only the rows others took: two lag-0 floods ahead of
// it. Two such claimers would both serve the first flood; its second
// charge, starting at its pass, moves the clock there, which puts the second
// flood back at lag 0 with rows older than the newcomer's, and the floods
// take turns until both drain. With the queue's lock every claim sees the
// charges before it: each flood gets one claim and the newcomer goes next,
// whatever the number of claimers, and the floods then share evenly.
func TestTwoFloodsCannotHoldANoDebtKey(t *testing.T) {
	t.Parallel()
	const flood = 50
	for c := 1; c <= 3; c++ {
		s := newSim()
		s.add("a", flood)
		s.add("b", flood)
		id := s.add("newcomer", 1)
		waited, rounds := 0, 0
	wait:
		for {
			rounds++
			for _, r := range s.round(c) {
				require.True(t, r.OK)
				if r.Task.ID == id {
					break wait
				}
				waited++
			}
		}
		require.Equal(t, 2, waited, "c=%d", c)
		require.LessOrEqual(t, rounds, 3, "c=%d", c)
		// From here on, rounds of two claimers serve each flood once.
		for s.pend["a"] > 0 && s.pend["b"] > 0 {
			for _, r := range s.round(2) {
				require.True(t, r.OK)
			}
			require.LessOrEqual(t, math.Abs(float64(s.pend["a"]-s.pend["b"])), 1.0, "c=%d", c)
		}
	}
}
