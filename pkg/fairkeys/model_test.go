package fairkeys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func fair(now time.Time) ClaimRequest {
	return ClaimRequest{Queue: "q", Worker: "w1", Now: now, Fair: true}
}

func ordinary(now time.Time) ClaimRequest {
	return ClaimRequest{Queue: "q", Worker: "w1", Now: now}
}

func task(id int64, key string, due int) Task {
	return Task{ID: id, Queue: "q", Key: key, DueAt: at(due)}
}

func claimedID(t *testing.T, r ClaimResult) int64 {
	t.Helper()
	require.True(t, r.OK, "claim got nothing: %+v", r)
	require.Empty(t, r.Empty)
	return r.Task.ID
}

func TestClaimOrderStickyIsAPreferenceNotAnExclusion(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	sticky := task(2, "a", 5)
	sticky.Priority = -10
	sticky.StickyWorker, sticky.StickyUntil = "w1", at(100)
	m.Insert(sticky)
	expired := task(3, "a", 6)
	expired.StickyWorker, expired.StickyUntil = "w2", at(10)

	m.Insert(expired)
	// w1 takes its sticky row first despite the lower priority.
	require.Equal(t, int64(2), claimedID(t, m.Claim(fair(at(10)))))

	m2 := NewModel()
	m2.Insert(sticky)
	req := fair(at(10))
	req.Worker = "w2"
	// Another worker still gets the row sticky to w1.
	require.Equal(t, int64(2), claimedID(t, m2.Claim(req)))

	// w2's stickiness on row 3 expired at exactly Now, so it is ordinary.
	req.Worker = "w2"
	require.Equal(t, int64(1), claimedID(t, m.Claim(req)))
}

func TestClaimOrderPriorityBeatsLag(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	m.Insert(task(2, "a", 0))
	claimedID(t, m.Claim(fair(at(1)))) // a now in debt
	hi := task(3, "a", 2)
	hi.Priority = 1
	m.Insert(hi)
	m.Insert(task(4, "b", 0))
	require.Equal(t, int64(3), claimedID(t, m.Claim(fair(at(3)))))
	require.Equal(t, int64(4), claimedID(t, m.Claim(fair(at(3)))))
}

func TestClaimOrderAgeing(t *testing.T) {
	t.Parallel()
	m := NewModel()
	old := task(1, "a", 0)
	m.Insert(old)
	hi := task(2, "a", 0)
	hi.Priority = 3
	hi.DueAt = at(30)
	m.Insert(hi)

	req := ordinary(at(30).Add(-time.Microsecond))
	req.AgingSecs = 10
	// Old row waited 29.999999s: boost 2, less than priority 3. Row 2 is not due.
	m.Insert(Task{ID: 3, Queue: "q", Key: "a", Priority: 3, DueAt: at(29)})
	require.Equal(t, int64(3), claimedID(t, m.Claim(req)))

	req.Now = at(30)
	// Now the old row has waited 30s: boost 3, equal priority; earlier due wins.
	require.Equal(t, int64(1), claimedID(t, m.Claim(req)))
	require.Equal(t, int64(2), claimedID(t, m.Claim(req)))

	// Without ageing the plain priority decides.
	m2 := NewModel()
	m2.Insert(old)
	m2.Insert(hi)
	require.Equal(t, int64(2), claimedID(t, m2.Claim(ordinary(at(1000)))))
}

func TestClaimOrderLagAndOrdinaryClaimIgnoresIt(t *testing.T) {
	t.Parallel()
	m := NewModel()
	for i := int64(1); i <= 3; i++ {
		m.Insert(task(i, "flood", 0))
	}
	m.Insert(task(4, "small", 1))
	ord := m.Clone()

	require.Equal(t, int64(1), claimedID(t, m.Claim(fair(at(2)))))
	r := m.Claim(fair(at(2)))
	require.Equal(t, int64(4), claimedID(t, r), "the key without debt goes first")
	require.Zero(t, r.Lag)

	require.Equal(t, int64(1), claimedID(t, ord.Claim(ordinary(at(2)))))
	require.Equal(t, int64(2), claimedID(t, ord.Claim(ordinary(at(2)))))
	_, ok := ord.State("q", "flood")
	require.False(t, ok, "an ordinary claim charges nothing")
}

func TestClaimOrderFairnessBeforeContinuationBand(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	cont := task(2, "a", 5)
	cont.Continuation = true
	m.Insert(cont)
	m.Insert(task(3, "b", 1))
	// Equal lag (both new): the continuation beats the earlier first task.
	require.Equal(t, int64(2), claimedID(t, m.Claim(fair(at(10)))))
	// a is in debt now, so b's first task beats a's row.
	require.Equal(t, int64(3), claimedID(t, m.Claim(fair(at(10)))))
}

func TestClaimOrderDueThenID(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(3, "a", 1))
	m.Insert(task(2, "a", 2))
	m.Insert(task(1, "a", 2))
	m.Insert(task(0, "a", 50)) // not due
	for _, want := range []int64{3, 1, 2} {
		require.Equal(t, want, claimedID(t, m.Claim(ordinary(at(10)))))
	}
	r := m.Claim(ordinary(at(10)))
	require.Equal(t, EmptyNoTask, r.Empty)
	require.False(t, r.OK)
	require.Equal(t, 1, m.Pending("q"))
}

func TestChargeArithmetic(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetWeight("q", "a", 4)
	m.SetWeight("q", DefaultKey, 4) // ignored
	for i := int64(1); i <= 3; i++ {
		m.Insert(task(i, "a", 0))
	}
	m.Insert(task(10, DefaultKey, 0))
	m.Insert(task(11, DefaultKey, 0))
	require.Equal(t, 1.0, m.Weight("q", DefaultKey))

	claimedID(t, m.Claim(fair(at(1)))) // a: start 0, pass 0.25
	s, _ := m.State("q", "a")
	require.Equal(t, KeyState{Pass: 0.25, LastStart: 0, ChargedAt: at(1)}, s)
	claimedID(t, m.Claim(fair(at(2)))) // default key at lag 0
	s, _ = m.State("q", DefaultKey)
	require.Equal(t, 1.0, s.Pass)
	claimedID(t, m.Claim(fair(at(3)))) // a: start 0.25
	s, _ = m.State("q", "a")
	require.Equal(t, KeyState{Pass: 0.5, LastStart: 0.25, ChargedAt: at(3)}, s)
	require.Equal(t, 0.25, m.Clock("q"))
}

func TestWeightChangeAppliesAtTheNextClaim(t *testing.T) {
	t.Parallel()
	m := NewModel()
	for i := int64(1); i <= 4; i++ {
		m.Insert(task(i, "a", 0))
	}
	claimedID(t, m.Claim(fair(at(1))))
	m.SetWeight("q", "a", 4)
	claimedID(t, m.Claim(fair(at(2))))
	s, _ := m.State("q", "a")
	require.Equal(t, 1.25, s.Pass)

	// Each charge reads the weight of the moment.
	m.SetWeight("q", "a", 2)
	claimedID(t, m.Claim(fair(at(3))))
	claimedID(t, m.Claim(fair(at(3))))
	s, _ = m.State("q", "a")
	require.Equal(t, 2.25, s.Pass)
	m.ClearWeight("q", "a")
	require.Equal(t, 1.0, m.Weight("q", "a"))
}

// Priority comes before the lag: a key in debt whose row has a higher
// priority goes before a key with no debt, and a key whose other rows are
// taken never lets a lower priority through while a higher one is due.
func TestPriorityComesBeforeTheLag(t *testing.T) {
	t.Parallel()
	m := NewModel()
	for i := int64(1); i <= 3; i++ {
		hi := task(i, "a", int(i))
		hi.Priority = 5
		m.Insert(hi)
	}
	m.Insert(task(4, "b", 0))
	for i := int64(1); i <= 3; i++ {
		r := m.Claim(fair(at(10)))
		require.Equal(t, i, claimedID(t, r), "a's priority-5 rows first, though a is in debt after the first")
	}
	require.Equal(t, int64(4), claimedID(t, m.Claim(fair(at(10)))))
}

// A cancel takes a pending row out of play and frees a running row's slot
// under its quota's cap; the charge of a claim already made stands.
func TestCancelLeavesChargesAlone(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetQuota("q", "z", Quota{MaxConcurrent: 1})
	for i := int64(1); i <= 3; i++ {
		tk := task(i, "a", int(i))
		tk.QuotaKey = "z"
		m.Insert(tk)
	}
	require.Equal(t, int64(1), claimedID(t, m.Claim(fair(at(10)))))
	before, _ := m.State("q", "a")
	m.Cancel(2)
	require.Equal(t, TaskDone, m.TaskState(2))
	r := m.Claim(fair(at(10)))
	require.False(t, r.OK, "task 1 still holds the cap")
	require.Equal(t, []Refusal{{TaskID: 3, QuotaKey: "z", Reason: ReasonConcurrencyCap}}, r.Refused)
	m.Cancel(1)
	require.Equal(t, 0, m.Running("q", "z"))
	after, _ := m.State("q", "a")
	require.Equal(t, before, after)
	require.Equal(t, int64(3), claimedID(t, m.Claim(fair(at(10)))))
	m.Cancel(99) // unknown: nothing happens
	m.Cancel(1)  // already done
	require.Equal(t, 1, m.Running("q", "z"))
}

// A fair claim whose pick of a key's head is refused leaves that key out:
// the key's later rows wait behind its head, whatever their quota keys.
// Other keys still get the claim, so the capped quota does not starve them.
func TestRecheckRefusedHeadSkipsItsKey(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetQuota("q", "capped", Quota{MaxConcurrent: 1})
	for i := int64(1); i <= 5; i++ {
		tk := task(i, "a", int(i))
		tk.QuotaKey = "capped"
		m.Insert(tk)
	}
	// Later rows of key a: one without a quota key, one of another quota.
	m.Insert(task(7, "a", 40))
	free := task(8, "a", 45)
	free.QuotaKey = "free"
	m.Insert(free)
	other := task(9, "b", 50)
	other.Priority = -1 // after key a's head
	m.Insert(other)

	require.Equal(t, int64(1), claimedID(t, m.Claim(fair(at(60)))))
	before, _ := m.State("q", "a")
	r := m.Claim(fair(at(61)))
	require.Equal(t, int64(9), claimedID(t, r), "the capped head does not starve key b")
	require.Equal(t, []Refusal{{TaskID: 2, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused)
	require.Equal(t, TaskPending, m.TaskState(2))
	after, _ := m.State("q", "a")
	require.Equal(t, before, after, "a refusal charges nothing")

	r = m.Claim(fair(at(62)))
	require.False(t, r.OK, "rows 7 and 8 wait behind their key's refused head")
	require.Equal(t, EmptyRefused, r.Empty)
	require.Equal(t, []Refusal{{TaskID: 2, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused)
	require.Equal(t, TaskPending, m.TaskState(7))
	require.Equal(t, TaskPending, m.TaskState(8))

	m.Complete(1)
	require.Equal(t, int64(2), claimedID(t, m.Claim(fair(at(63)))))
}

// A key whose head carries a quota key refused earlier in the same fair
// claim is left out without a recheck of its own: its head would be
// refused the same way, and its later rows wait behind it.
func TestRecheckRefusedQuotaKeySkipsOtherKeysHeads(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetQuota("q", "capped", Quota{MaxConcurrent: 1})
	run := task(1, "z", 0)
	run.QuotaKey = "capped"
	m.Insert(run)
	claimedID(t, m.ClaimByID(1, fair(at(1))))
	for i, key := range []string{"a", "b"} {
		head := task(int64(10+i), key, i)
		head.QuotaKey = "capped"
		m.Insert(head)
		m.Insert(task(int64(20+i), key, 10+i)) // no quota, behind its head
	}
	m.Insert(task(30, "c", 30))

	r := m.Claim(fair(at(60)))
	require.Equal(t, int64(30), claimedID(t, r))
	require.Equal(t, []Refusal{{TaskID: 10, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused,
		"key b's head is left out without a second refusal")

	// A row pinned to the worker is its key's head for that worker's claims.
	pinned := task(40, "d", 50)
	pinned.QuotaKey = "capped"
	pinned.StickyWorker, pinned.StickyUntil = "w1", at(1000)
	m.Insert(pinned)
	m.Insert(task(41, "d", 0))
	r = m.Claim(fair(at(61)))
	require.False(t, r.OK, "key d waits behind the pinned head refused first")
	require.Equal(t, []Refusal{{TaskID: 40, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused)
	other := fair(at(61))
	other.Worker = "w2"
	r = m.Claim(other)
	require.Equal(t, int64(41), claimedID(t, r), "for another worker row 41 is key d's head")
	require.Equal(t, []Refusal{{TaskID: 10, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused)
}

// An ordinary claim knows no keys: a refusal leaves out the rows of its
// quota key only, and the claim reads on past them.
func TestRecheckOrdinarySkipsTheQuotaKey(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetQuota("q", "capped", Quota{MaxConcurrent: 1})
	for i := int64(1); i <= 3; i++ {
		tk := task(i, "a", int(i))
		tk.QuotaKey = "capped"
		m.Insert(tk)
	}
	m.Insert(task(7, "a", 40))
	require.Equal(t, int64(1), claimedID(t, m.Claim(ordinary(at(60)))))
	r := m.Claim(ordinary(at(61)))
	require.Equal(t, int64(7), claimedID(t, r))
	require.Equal(t, []Refusal{{TaskID: 2, QuotaKey: "capped", Reason: ReasonConcurrencyCap}}, r.Refused)
}

func TestRecheckRateLimit(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.SetQuota("q", "r", Quota{Rate: 0.5, Burst: 2})
	for i := int64(1); i <= 5; i++ {
		tk := task(i, "a", 0)
		tk.QuotaKey = "r"
		m.Insert(tk)
	}
	claimedID(t, m.Claim(fair(at(10)))) // full bucket: 2 -> 1
	claimedID(t, m.Claim(fair(at(10)))) // 1 -> 0
	st, _ := m.State("q", "a")
	r := m.Claim(fair(at(11))) // refill 0.5: refused, bucket untouched
	require.Equal(t, EmptyRefused, r.Empty)
	require.Equal(t, ReasonRateLimit, r.Refused[0].Reason)
	st2, _ := m.State("q", "a")
	require.Equal(t, st, st2, "a refusal charges nothing")
	// Had the refusal stamped the bucket at 11s without keeping its refill,
	// 12s would see 0.5 tokens; untouched, 2s of refill since 10s gives 1.
	claimedID(t, m.Claim(fair(at(12))))
	r = m.Claim(fair(at(12)))
	require.Equal(t, EmptyRefused, r.Empty)
	claimedID(t, m.Claim(fair(at(14))))
}

func TestRefusalBound(t *testing.T) {
	t.Parallel()
	m := NewModel()
	// Ten quota keys each at their cap, with a pending row each that sorts
	// ahead of one unquota'd row; each in a key of its own, since a fair
	// claim leaves out a key whose head it refused.
	for i := int64(0); i < 10; i++ {
		qk := string(rune('A' + i))
		m.SetQuota("q", qk, Quota{MaxConcurrent: 1})
		run := task(100+i, "a", 0)
		run.QuotaKey = qk
		m.Insert(run)
		claimedID(t, m.ClaimByID(run.ID, ordinary(at(0))))
		wait := task(200+i, "k"+qk, int(i))
		wait.QuotaKey = qk
		wait.Priority = 1
		m.Insert(wait)
	}
	m.Insert(task(300, "b", 0))
	r := m.Claim(fair(at(100)))
	require.False(t, r.OK)
	require.Equal(t, EmptyRefused, r.Empty)
	require.Len(t, r.Refused, MaxRefusalsPerClaim)
	for i, ref := range r.Refused {
		require.Equal(t, int64(200+i), ref.TaskID)
	}
	require.Equal(t, TaskPending, m.TaskState(300))
	_, charged := m.State("q", "b")
	require.False(t, charged)
}

func TestClaimByID(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	m.Insert(task(2, "a", 0))
	m.Insert(task(3, "a", 100))
	capped := task(4, "b", 0)
	capped.QuotaKey = "z"
	m.Insert(capped)
	m.SetQuota("q", "z", Quota{MaxConcurrent: 1})
	run := task(5, "c", 0)
	run.QuotaKey = "z"
	m.Insert(run)

	r := m.ClaimByID(2, fair(at(1)))
	require.Equal(t, int64(2), claimedID(t, r))
	s, ok := m.State("q", "a")
	require.True(t, ok)
	require.Equal(t, 1.0, s.Pass, "a dispatch claim charges the key")

	require.Equal(t, EmptyNoTask, m.ClaimByID(2, fair(at(1))).Empty, "already running")
	require.Equal(t, EmptyNoTask, m.ClaimByID(3, fair(at(1))).Empty, "not due")
	require.Equal(t, EmptyNoTask, m.ClaimByID(99, fair(at(1))).Empty, "unknown")
	other := fair(at(1))
	other.Queue = "elsewhere"
	require.Equal(t, EmptyNoTask, m.ClaimByID(1, other).Empty, "wrong queue")

	r = m.ClaimByID(1, fair(at(2)))
	require.Equal(t, 1.0, r.Lag)
	s, _ = m.State("q", "a")
	require.Equal(t, 2.0, s.Pass)

	require.Equal(t, int64(5), claimedID(t, m.ClaimByID(5, ordinary(at(2)))))
	_, ok = m.State("q", "c")
	require.False(t, ok, "an ordinary dispatch claim charges nothing")
	r = m.ClaimByID(4, fair(at(2)))
	require.Equal(t, EmptyRefused, r.Empty)
	require.Equal(t, []Refusal{{TaskID: 4, QuotaKey: "z", Reason: ReasonConcurrencyCap}}, r.Refused)
	require.Equal(t, TaskPending, m.TaskState(4))
}

func TestRequeueAndComplete(t *testing.T) {
	t.Parallel()
	m := NewModel()
	tk := task(1, "a", 0)
	tk.QuotaKey = "z"
	m.Insert(tk)
	require.Equal(t, TaskUnknown, m.TaskState(7))
	m.Complete(1) // pending: left alone
	require.Equal(t, TaskPending, m.TaskState(1))
	claimedID(t, m.Claim(fair(at(1))))
	require.Equal(t, 1, m.Running("q", "z"))
	require.Zero(t, m.Pending("q"))

	m.Requeue(1, at(50))
	require.Equal(t, TaskPending, m.TaskState(1))
	require.Zero(t, m.Running("q", "z"))
	require.Equal(t, EmptyNoTask, m.Claim(fair(at(49))).Empty, "the retry waits for its new due time")
	r := m.Claim(fair(at(50)))
	require.Equal(t, at(50), r.Task.DueAt)
	require.Equal(t, 1.0, r.Lag, "the charge of the lost attempt stands")

	m.Complete(1)
	require.Equal(t, TaskDone, m.TaskState(1))
	m.Requeue(1, at(60)) // done: left alone
	require.Equal(t, TaskDone, m.TaskState(1))
	require.Zero(t, m.Running("q", "z"))
}

func TestInsertDuplicatePanics(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	require.Panics(t, func() { m.Insert(task(1, "b", 0)) })
	require.Panics(t, func() { m.SetWeight("q", "a", 0) })
}

func TestPruneKeepsTheClockRowAndPendingKeys(t *testing.T) {
	t.Parallel()
	m := NewModel()
	for i, k := range []string{"a", "b", "c", "d"} {
		m.Insert(task(int64(i+1), k, 0))
		claimedID(t, m.Claim(fair(at(i))))
	}
	// Ties at LastStart 0: the greatest key, d, is the clock row.
	m.Insert(task(10, "a", 0))
	m.Insert(task(11, "b", 100)) // pending but not due still counts
	v := m.Clock("q")

	require.Empty(t, m.Prune(at(10), time.Hour), "everything is recent")
	got := m.Prune(at(10), 7*time.Second) // cutoff 3s: d charged at 3s is not recent
	require.Equal(t, []StateKey{{"q", "c"}}, got)
	_, ok := m.State("q", "d")
	require.True(t, ok, "the clock row survives")
	require.Equal(t, v, m.Clock("q"))
}

func TestPruneForgivesAnIdleQueue(t *testing.T) {
	t.Parallel()
	m := NewModel()
	m.Insert(task(1, "a", 0))
	m.Insert(task(2, "a", 0))
	claimedID(t, m.Claim(fair(at(1))))
	claimedID(t, m.Claim(fair(at(2))))
	m.Complete(1)
	require.Equal(t, 1.0, m.Clock("q"))

	require.Empty(t, m.Prune(at(5), 10*time.Second), "charged inside the window")
	// Task 2 is still running, but the queue has nothing pending: idle.
	require.Equal(t, []StateKey{{"q", "a"}}, m.Prune(at(30), 10*time.Second))
	require.Zero(t, m.Clock("q"))
	m.Insert(task(3, "a", 30))
	require.Zero(t, m.Claim(fair(at(30))).Lag, "all debt forgiven")
}
