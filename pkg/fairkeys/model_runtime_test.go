package fairkeys

// Property tests of charging by runtime (SetCharge(ChargeRuntime)) on the
// Model: keys whose tasks take very different times share the worker time
// by their weights, within a bound set by the longest task and the number
// of worker slots, and a key pays exactly the time its attempts held.

import (
	"container/heap"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// slotSim runs a queue on a fixed number of worker slots: each free slot
// claims fairly, a claimed task holds its slot for its key's duration, and
// the earliest to end completes first (CompleteHeld with its real time).
type slotSim struct {
	m       *Model
	now     time.Time
	nextID  int64
	dur     map[string]float64 // seconds a task of the key holds a slot
	running endHeap
	held    map[string]float64 // seconds held by ended attempts, per key
	claims  map[string]int
	// backlog keeps this many pending tasks per key (the model reads every
	// pending row per claim, so the backlog is topped up, not preloaded).
	backlog int
	pending map[string]int
}

type ending struct {
	at  time.Time
	id  int64
	key string
}

type endHeap []ending

func (h endHeap) Len() int { return len(h) }
func (h endHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].id < h[j].id
}
func (h endHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)   { *h = append(*h, x.(ending)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newSlotSim(backlog int, dur map[string]float64) *slotSim {
	s := &slotSim{m: NewModel(), now: t0, dur: dur, held: map[string]float64{}, claims: map[string]int{},
		backlog: backlog, pending: map[string]int{}}
	s.topUp()
	return s
}

// topUp gives every key its backlog again: both keys have work throughout.
func (s *slotSim) topUp() {
	for key := range s.dur {
		for ; s.pending[key] < s.backlog; s.pending[key]++ {
			s.nextID++
			s.m.Insert(Task{ID: s.nextID, Queue: propQueue, Key: key, DueAt: t0})
		}
	}
}

// fill claims until every slot is busy or nothing is left.
func (s *slotSim) fill(slots int) {
	for s.running.Len() < slots {
		r := s.m.Claim(ClaimRequest{Queue: propQueue, Now: s.now, Fair: true})
		if !r.OK {
			return
		}
		s.claims[r.Task.Key]++
		s.pending[r.Task.Key]--
		s.topUp()
		d := time.Duration(s.dur[r.Task.Key] * float64(time.Second))
		heap.Push(&s.running, ending{at: s.now.Add(d), id: r.Task.ID, key: r.Task.Key})
	}
}

// step ends the earliest attempt and refills its slot.
func (s *slotSim) step(slots int) {
	e := heap.Pop(&s.running).(ending)
	s.now = e.at
	secs := s.dur[e.key]
	s.m.CompleteHeld(e.id, secs)
	s.held[e.key] += secs
	s.fill(slots)
}

// Two keys with tasks of 10 ms to 3 s, random weights, 1 to 100 slots,
// both backlogged: after every ended attempt, the worker time each key has
// held, over its weight, differs from the other's by at most
// (slots + 2) x the longest time a claim bills or a task holds, over the
// smaller weight. Every in-flight attempt is billed its estimate before it
// ends (at most slots of them per key), and start-time fair queuing keeps
// backlogged keys within one claim's charge of each other.
func TestPropertyRuntimeShares(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		slots := rapid.SampledFrom([]int{1, 2, 7, 20, 100}).Draw(rt, "slots")
		durs := []float64{0.01, 0.02, 0.1, 0.5, 2, 3}
		s := newSlotSim(8, map[string]float64{
			"a": rapid.SampledFrom(durs).Draw(rt, "a secs"),
			"b": rapid.SampledFrom(durs).Draw(rt, "b secs"),
		})
		s.m.SetCharge(propQueue, ChargeRuntime)
		w := map[string]float64{"a": weightGen.Draw(rt, "a weight"), "b": weightGen.Draw(rt, "b weight")}
		s.m.SetWeight(propQueue, "a", w["a"])
		s.m.SetWeight(propQueue, "b", w["b"])
		longest := max(s.dur["a"], s.dur["b"], DefaultHeldEstimate)
		bound := float64(slots+2) * longest / min(w["a"], w["b"])
		s.fill(slots)
		steps := rapid.IntRange(200, 1500).Draw(rt, "steps")
		worst := 0.0
		for range steps {
			s.step(slots)
			gap := math.Abs(s.held["a"]/w["a"] - s.held["b"]/w["b"])
			worst = max(worst, gap)
			if gap > bound {
				rt.Fatalf("worker time over weight: a %.3f s, b %.3f s (gap %.3f, bound %.3f) after %d claims of a and %d of b",
					s.held["a"]/w["a"], s.held["b"]/w["b"], gap, bound, s.claims["a"], s.claims["b"])
			}
		}
		rt.Logf("worst gap %.3f of bound %.3f", worst, bound)
	})
}

// 2 s tasks against 20 ms tasks, equal weights, 100 slots: charged by
// runtime each key holds about half of the worker time once the fleet has
// run for a while; charged per claim the slow key holds nearly all of it.
func TestRuntimeHalvesWorkerTime(t *testing.T) {
	t.Parallel()
	share := func(c Charge) float64 {
		s := newSlotSim(8, map[string]float64{"slow": 2, "fast": 0.02})
		s.m.SetCharge(propQueue, c)
		s.fill(100)
		for s.now.Before(t0.Add(10 * time.Minute)) {
			s.step(100)
		}
		return s.held["slow"] / (s.held["slow"] + s.held["fast"])
	}
	byRuntime, byClaims := share(ChargeRuntime), share(ChargeClaims)
	require.InDelta(t, 0.5, byRuntime, 0.05, "slow key's share of worker time, charged by runtime")
	require.Greater(t, byClaims, 0.95, "slow key's share of worker time, charged per claim")
	t.Logf("slow key's share of worker time: %.3f by runtime, %.3f by claims", byRuntime, byClaims)
}

// Whatever the estimates billed up front, once every attempt has ended and
// been settled a continuously backlogged key's pass has moved by exactly
// the time its attempts held over its weight: the estimates cancel out.
func TestPropertyRuntimeSettlesExactly(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		m := NewModel()
		m.SetCharge(propQueue, ChargeRuntime)
		wa := weightGen.Draw(rt, "weight")
		m.SetWeight(propQueue, "a", wa)
		n := rapid.IntRange(1, 30).Draw(rt, "tasks")
		for i := range n {
			m.Insert(Task{ID: int64(i + 1), Queue: propQueue, Key: "a", DueAt: t0})
		}
		var total float64
		for range n {
			r := m.Claim(ClaimRequest{Queue: propQueue, Now: t0, Fair: true})
			require.True(rt, r.OK)
			secs := rapid.Float64Range(0, 5).Draw(rt, "held")
			m.CompleteHeld(r.Task.ID, secs)
			total += secs / wa
		}
		m.foldHeld(propQueue)
		s, ok := m.State(propQueue, "a")
		require.True(rt, ok)
		// One key alone is never behind the clock, so every start is its
		// pass: pass = the first estimate's start (0) + everything held.
		require.InDelta(rt, total, s.Pass, 1e-9*max(1, total))
	})
}
