package fairkeys

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Task is one claimable row as the model sees it. Times are expected at
// microsecond resolution, as the database stores them, so that ageing and
// the rate bucket compute the same numbers in both places.
type Task struct {
	// ID is unique across the model and breaks every remaining tie.
	ID int64
	// Queue scopes everything: lags, clocks, weights and quotas.
	Queue string
	// Key is the resolved fairness key (see Resolve); DefaultKey is valid.
	Key string
	// QuotaKey selects the post-claim rechecks; "" means none apply.
	QuotaKey string
	// Priority sorts higher values first.
	Priority int
	// Continuation marks a follow-up task of a run already in progress. At
	// equal priority and lag it goes before first tasks, so runs finish
	// rather than pile up half done.
	Continuation bool
	// DueAt is when the row becomes claimable; among otherwise equal rows
	// the one due first goes first.
	DueAt time.Time
	// StickyWorker, while StickyUntil is in the future, makes that worker
	// prefer this row. Other workers may still take it.
	StickyWorker string
	StickyUntil  time.Time
}

// TaskState is the life-cycle position of a task in the model.
type TaskState int

// Task states. TaskUnknown is what TaskState reports for an ID never
// inserted, so the zero value never passes for a real state.
const (
	TaskUnknown TaskState = iota
	TaskPending
	TaskRunning
	TaskDone
)

// String returns the lower-case state name.
func (s TaskState) String() string {
	switch s {
	case TaskPending:
		return "pending"
	case TaskRunning:
		return "running"
	case TaskDone:
		return "done"
	default:
		return "unknown"
	}
}

// Quota holds the post-claim rechecks of one (queue, quota key).
type Quota struct {
	// MaxConcurrent caps running tasks of the quota key; 0 disables the cap.
	MaxConcurrent int
	// Rate refills the token bucket, in tokens per second; 0 disables it.
	Rate float64
	// Burst is the bucket's capacity and its level when first used.
	Burst float64
}

// KeyState is the fairness state row of one (queue, key).
type KeyState struct {
	// Pass is the virtual time at which the key's next claim may start.
	Pass float64
	// LastStart is the start tag of the key's latest claim; the largest
	// LastStart of a queue is that queue's clock.
	LastStart float64
	// ChargedAt is the wall time of the latest charge; prune reads it.
	ChargedAt time.Time
}

// StateKey names one fairness state row (also used for weights and quotas,
// where Key is the quota key).
type StateKey struct {
	Queue string `json:"queue"`
	Key   string `json:"key"`
}

// ClaimRequest describes one claim attempt.
type ClaimRequest struct {
	// Queue is the one queue this claim serves; lags of different queues
	// do not compare, so a multi-queue worker claims one queue at a time.
	Queue string
	// Worker identifies the claim loop for sticky affinity.
	Worker string
	// Now is the claim's clock: it decides what is due, ageing, stickiness,
	// the rate bucket and ChargedAt.
	Now time.Time
	// Fair turns on the lag sort term and the charge. An ordinary claim
	// ignores keys entirely, so mixing the two kinds of worker is safe but
	// the ordinary ones are invisible to fairness.
	Fair bool
	// AgingSecs is the ageing period: a row gains one priority level per
	// full period waited since it became due. 0 disables ageing.
	AgingSecs int
}

// Refusal records a row that a recheck gave back during a claim.
type Refusal struct {
	TaskID   int64  `json:"task_id"`
	QuotaKey string `json:"quota_key"`
	// Reason is ReasonConcurrencyCap or ReasonRateLimit.
	Reason string `json:"reason"`
}

// Refusal reasons.
const (
	ReasonConcurrencyCap = "concurrency_cap"
	ReasonRateLimit      = "rate_limit"
)

// Values of ClaimResult.Empty.
const (
	EmptyNoTask  = "no_task"
	EmptyRefused = "refused"
)

// ClaimResult is the outcome of one claim.
type ClaimResult struct {
	// Task is the claimed row; meaningful only when OK.
	Task Task
	OK   bool
	// Lag is the picked key's lag when it was chosen (0 for ordinary claims).
	Lag float64
	// Refused lists rows given back before the pick, or before giving up.
	Refused []Refusal
	// Empty explains a claim that got nothing: EmptyNoTask when no due
	// pending row was there to try, EmptyRefused when rechecks refused
	// every row tried. It is "" when OK.
	Empty string
}

// MaxRefusalsPerClaim bounds the rows one claim may try and give back. It
// keeps a claim's cost bounded when many quota keys are exhausted; the rows
// left untried wait for the next claim.
const MaxRefusalsPerClaim = 8

type taskRow struct {
	t  Task
	st TaskState
	// billed is what the running attempt's claim billed its key in a
	// queue charged by runtime (seconds); runtime says it did.
	billed  float64
	runtime bool
}

type bucket struct {
	tokens    float64
	updatedAt time.Time
}

// Model is the pure, single-threaded reference of the fair claim. Every
// method is deterministic: the same calls give the same results, so a
// database test can replay them against the SQL and require the same pick
// at every step. A Model is not safe for concurrent use; concurrent SQL
// claims are modelled by single claims in the order they took the queue's
// fair lock (see the package documentation).
type Model struct {
	tasks   map[int64]*taskRow
	pending map[string]map[int64]*taskRow // queue -> pending rows (due or not)
	running map[StateKey]int              // (queue, quota key) -> running rows
	weights map[StateKey]float64
	quotas  map[StateKey]Quota
	buckets map[StateKey]bucket
	states  map[string]map[string]KeyState // queue -> key -> row

	// Two-level queues (SetTwoLevel): their groups' rows, one per
	// (queue, group), and the groups' weights.
	twoLevel     map[string]bool
	groupStates  map[string]map[string]KeyState // queue -> group -> row
	groupWeights map[StateKey]float64

	// Queues charged by runtime (SetCharge), each key's runtime estimate
	// (it lives and goes with the key's row), and the ended attempts not
	// yet settled, per queue in the order they ended.
	runtime map[string]bool
	heldEst map[StateKey]float64
	held    map[string][]heldRow
}

// NewModel returns an empty model: no tasks, no overrides, no quotas and no
// fairness state.
func NewModel() *Model {
	return &Model{
		tasks:   map[int64]*taskRow{},
		pending: map[string]map[int64]*taskRow{},
		running: map[StateKey]int{},
		weights: map[StateKey]float64{},
		quotas:  map[StateKey]Quota{},
		buckets: map[StateKey]bucket{},
		states:  map[string]map[string]KeyState{},

		twoLevel:     map[string]bool{},
		groupStates:  map[string]map[string]KeyState{},
		groupWeights: map[StateKey]float64{},

		runtime: map[string]bool{},
		heldEst: map[StateKey]float64{},
		held:    map[string][]heldRow{},
	}
}

// Clone returns an independent deep copy, for previews and for tests that
// compare two futures of one history.
func (m *Model) Clone() *Model {
	c := NewModel()
	for id, r := range m.tasks {
		cp := *r
		c.tasks[id] = &cp
		if cp.st == TaskPending {
			c.pendingOf(cp.t.Queue)[id] = &cp
		}
	}
	for k, v := range m.running {
		c.running[k] = v
	}
	for k, v := range m.weights {
		c.weights[k] = v
	}
	for k, v := range m.quotas {
		c.quotas[k] = v
	}
	for k, v := range m.buckets {
		c.buckets[k] = v
	}
	c.states = copyStates(m.states)
	for q, on := range m.twoLevel {
		c.twoLevel[q] = on
	}
	c.groupStates = copyStates(m.groupStates)
	for k, v := range m.groupWeights {
		c.groupWeights[k] = v
	}
	for q, on := range m.runtime {
		c.runtime[q] = on
	}
	for k, v := range m.heldEst {
		c.heldEst[k] = v
	}
	for q, rows := range m.held {
		c.held[q] = append([]heldRow(nil), rows...)
	}
	return c
}

func copyStates(in map[string]map[string]KeyState) map[string]map[string]KeyState {
	out := make(map[string]map[string]KeyState, len(in))
	for q, rows := range in {
		cp := make(map[string]KeyState, len(rows))
		for k, v := range rows {
			cp[k] = v
		}
		out[q] = cp
	}
	return out
}

func (m *Model) pendingOf(queue string) map[int64]*taskRow {
	p := m.pending[queue]
	if p == nil {
		p = map[int64]*taskRow{}
		m.pending[queue] = p
	}
	return p
}

// Insert adds t as a pending task. It panics on a duplicate ID: the model
// mirrors a primary key, and a silent overwrite would hide a broken test.
func (m *Model) Insert(t Task) {
	if _, dup := m.tasks[t.ID]; dup {
		panic(fmt.Sprintf("fairkeys: duplicate task id %d", t.ID))
	}
	r := &taskRow{t: t, st: TaskPending}
	m.tasks[t.ID] = r
	m.pendingOf(t.Queue)[t.ID] = r
}

// SetWeight stores an override. It is a no-op for DefaultKey, whose weight
// is fixed at 1, and panics on a weight ValidateWeight refuses, because the
// model only ever sees values the weight store accepted. The 1,000-override
// cap is not enforced here.
func (m *Model) SetWeight(queue, key string, w float64) {
	if key == DefaultKey {
		return
	}
	if err := ValidateWeight(w); err != nil {
		panic(fmt.Sprintf("fairkeys: weight %v: %v", w, err))
	}
	m.weights[StateKey{queue, key}] = w
}

// ClearWeight removes an override; the key weighs 1 from its next charge.
func (m *Model) ClearWeight(queue, key string) {
	delete(m.weights, StateKey{queue, key})
}

// Weight returns the weight the next charge of the key will use.
func (m *Model) Weight(queue, key string) float64 {
	w, ok := m.weights[StateKey{queue, key}]
	return EffectiveWeight(key, w, ok)
}

// SetQuota sets the rechecks of (queue, quotaKey). An existing rate bucket
// keeps its level; a lower Burst takes effect at its next refill.
func (m *Model) SetQuota(queue, quotaKey string, q Quota) {
	m.quotas[StateKey{queue, quotaKey}] = q
}

// ClearQuota removes the rechecks of (queue, quotaKey) and forgets its rate
// bucket, so a later SetQuota starts with a full bucket again.
func (m *Model) ClearQuota(queue, quotaKey string) {
	sk := StateKey{queue, quotaKey}
	delete(m.quotas, sk)
	delete(m.buckets, sk)
}

// State returns the fairness row of (queue, key), if there is one.
func (m *Model) State(queue, key string) (KeyState, bool) {
	s, ok := m.states[queue][key]
	return s, ok
}

// Clock returns the queue's virtual time V: the largest LastStart among its
// rows, or 0 when it has none (a fresh or fully pruned queue starts over).
func (m *Model) Clock(queue string) float64 {
	return clockOf(m.states[queue])
}

func clockOf(rows map[string]KeyState) float64 {
	v := 0.0
	first := true
	for _, s := range rows {
		if first || s.LastStart > v {
			v = s.LastStart
			first = false
		}
	}
	return v
}

// startTag is the virtual time at which the key's next claim starts. A key
// with no row starts at the clock, so arriving late earns neither debt nor
// credit; a key whose pass fell behind the clock (it went idle) is pulled
// up to it, so time spent away cannot be cashed in later.
func startTag(rows map[string]KeyState, v float64, key string) float64 {
	if s, ok := rows[key]; ok && s.Pass > v {
		return s.Pass
	}
	return v
}

// Lag returns the key's current lag in the queue: how far its start tag is
// ahead of the clock. 0 means the key has no debt.
//
// In a two-level queue the lag is the key's among the keys of its group,
// against the group's own clock (GroupLag gives the group's).
func (m *Model) Lag(queue, key string) float64 {
	rows := m.keyRows(queue, key)
	v := clockOf(rows)
	return startTag(rows, v, key) - v
}

// keyRows are the rows a key's start tag and clock are read from: every
// key of the queue, or in a two-level queue the keys of the key's group.
func (m *Model) keyRows(queue, key string) map[string]KeyState {
	rows := m.states[queue]
	if !m.twoLevel[queue] {
		return rows
	}
	g := GroupOf(key)
	out := map[string]KeyState{}
	for k, s := range rows {
		if GroupOf(k) == g {
			out[k] = s
		}
	}
	return out
}

// TaskState returns the state of a task, TaskUnknown for an unknown ID.
func (m *Model) TaskState(id int64) TaskState {
	if r, ok := m.tasks[id]; ok {
		return r.st
	}
	return TaskUnknown
}

// Pending counts the queue's pending tasks, due or not.
func (m *Model) Pending(queue string) int { return len(m.pending[queue]) }

// Running counts running tasks of (queue, quotaKey), the number the
// concurrency cap compares against.
func (m *Model) Running(queue, quotaKey string) int {
	return m.running[StateKey{queue, quotaKey}]
}

// Claim runs one claim: the first due pending row of the queue in claim
// order goes through the rechecks of its quota key, and an accepted row is
// leased and, for a fair request, charged to its key. A refused row stays
// pending and charges nothing; the claim then picks again, up to
// MaxRefusalsPerClaim refusals, and what it leaves out after a refusal
// depends on its kind:
//
//   - A fair claim leaves out the refused row's whole fairness key, and
//     every other key whose head carries a quota key already refused in
//     this claim (without a recheck and without a Refusal of its own: its
//     head would be refused the same way). A key's head is its best row for
//     this claim in the key's own order: rows pinned to the worker first,
//     then (effective) priority, band, due time and id; a fair claim only
//     ever takes a key's head. Taking a later row of such a key would read
//     past its blocked backlog: the row would run before rows its own key
//     put first, merely because a quota holds those back.
//   - An ordinary claim knows no keys: it leaves out the rows of the
//     refused quota key, so one exhausted quota cannot eat the refusal
//     budget while other rows wait.
func (m *Model) Claim(req ClaimRequest) ClaimResult {
	if req.Fair {
		m.foldHeld(req.Queue)
	}
	var (
		rows    = m.states[req.Queue]
		v       = clockOf(rows)
		skip    = map[string]bool{} // quota keys refused during this claim
		refused []Refusal
	)
	lagOf := func(key string) float64 { return startTag(rows, v, key) - v }
	if m.twoLevel[req.Queue] {
		// Within one claim nothing is charged before the pick, so each
		// key's lag is read once.
		memo := map[string]float64{}
		lagOf = func(key string) float64 {
			l, ok := memo[key]
			if !ok {
				l = m.Lag(req.Queue, key)
				memo[key] = l
			}
			return l
		}
	}
	for {
		best := m.pick(req, skip, lagOf)
		if best == nil {
			if len(refused) > 0 {
				return ClaimResult{Refused: refused, Empty: EmptyRefused}
			}
			return ClaimResult{Empty: EmptyNoTask}
		}
		if reason := m.recheck(best.t, req.Now); reason != "" {
			// The row goes back untouched. For a fair claim it was its
			// key's head, and the head carries the quota key now skipped,
			// so pick leaves the whole key out.
			refused = append(refused, Refusal{TaskID: best.t.ID, QuotaKey: best.t.QuotaKey, Reason: reason})
			skip[best.t.QuotaKey] = true
			if len(refused) >= MaxRefusalsPerClaim {
				return ClaimResult{Refused: refused, Empty: EmptyRefused}
			}
			continue
		}
		res := ClaimResult{Task: best.t, OK: true, Refused: refused}
		if req.Fair {
			res.Lag = lagOf(best.t.Key)
		}
		m.accept(best, req)
		return res
	}
}

// sortKey holds the sort terms of one candidate, smallest first.
type sortKey struct {
	sticky int
	prio   int64   // effective priority; larger sorts first
	glag   float64 // the group's lag, in a two-level queue (else 0)
	lag    float64
	band   int
	due    time.Time
	id     int64
}

func (a *sortKey) less(b *sortKey) bool {
	if a.sticky != b.sticky {
		return a.sticky < b.sticky
	}
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	if a.glag != b.glag {
		return a.glag < b.glag
	}
	if a.lag != b.lag {
		return a.lag < b.lag
	}
	if a.band != b.band {
		return a.band < b.band
	}
	if !a.due.Equal(b.due) {
		return a.due.Before(b.due)
	}
	return a.id < b.id
}

func (m *Model) sortKeyOf(t *Task, req ClaimRequest, lagOf func(string) float64) sortKey {
	k := sortKey{sticky: 1, prio: int64(t.Priority), band: 1, due: t.DueAt, id: t.ID}
	// Stickiness is only a preference: it ranks the worker's own rows first
	// but never hides them from others.
	if t.StickyWorker != "" && t.StickyWorker == req.Worker && t.StickyUntil.After(req.Now) {
		k.sticky = 0
	}
	if req.AgingSecs > 0 {
		// Integer microseconds keep the boost identical to what the
		// database computes from its microsecond timestamps. Candidates
		// are due, so waited is never negative and division floors.
		waited := req.Now.UnixMicro() - t.DueAt.UnixMicro()
		k.prio += waited / (int64(req.AgingSecs) * 1_000_000)
	}
	if req.Fair {
		k.lag = lagOf(t.Key)
		if m.twoLevel[req.Queue] {
			k.glag = m.GroupLag(req.Queue, GroupOf(t.Key)) // a handful of groups
		}
	}
	if t.Continuation {
		k.band = 0
	}
	return k
}

// pick returns the first due pending row of the queue in claim order,
// leaving out what refusals earlier in this claim excluded (skip: the
// quota keys refused; see Claim): for an ordinary claim the rows of those
// quota keys; for a fair claim every key whose head carries one of them,
// the keys whose head was refused among them (nothing is taken or charged
// within a claim before its pick, so a key's head stays the same).
func (m *Model) pick(req ClaimRequest, skip map[string]bool, lagOf func(string) float64) *taskRow {
	type cand struct {
		r *taskRow
		k sortKey
	}
	var (
		best  cand
		heads map[string]cand // fair: each key's head
	)
	if req.Fair {
		heads = map[string]cand{}
	}
	for _, r := range m.pending[req.Queue] {
		if r.t.DueAt.After(req.Now) {
			continue
		}
		c := cand{r, m.sortKeyOf(&r.t, req, lagOf)}
		if req.Fair {
			// Within a key the lags are equal, so the claim order is the
			// key's own order.
			if h, ok := heads[r.t.Key]; !ok || c.k.less(&h.k) {
				heads[r.t.Key] = c
			}
			continue
		}
		if r.t.QuotaKey != "" && skip[r.t.QuotaKey] {
			continue
		}
		if best.r == nil || c.k.less(&best.k) {
			best = c
		}
	}
	for _, h := range heads {
		if h.r.t.QuotaKey != "" && skip[h.r.t.QuotaKey] {
			continue
		}
		if best.r == nil || h.k.less(&best.k) {
			best = h
		}
	}
	return best.r
}

// recheck applies the quota of the row's (queue, quota key): first the
// concurrency cap, then the rate bucket. It returns "" to accept, in which
// case the bucket has been debited; a refusal writes nothing.
func (m *Model) recheck(t Task, now time.Time) string {
	if t.QuotaKey == "" {
		return ""
	}
	sk := StateKey{t.Queue, t.QuotaKey}
	q, ok := m.quotas[sk]
	if !ok {
		return ""
	}
	if q.MaxConcurrent > 0 && m.running[sk] >= q.MaxConcurrent {
		return ReasonConcurrencyCap
	}
	if q.Rate > 0 {
		b, used := m.buckets[sk]
		if !used {
			b = bucket{tokens: q.Burst, updatedAt: now}
		}
		// A clock that steps back must not drain tokens, so negative
		// elapsed time counts as none.
		elapsed := math.Max(0, now.Sub(b.updatedAt).Seconds())
		tokens := math.Min(q.Burst, b.tokens+q.Rate*elapsed)
		if tokens < 1 {
			return ReasonRateLimit
		}
		m.buckets[sk] = bucket{tokens: tokens - 1, updatedAt: now}
	}
	return ""
}

// accept moves the row to running and, for a fair claim, charges its key.
func (m *Model) accept(r *taskRow, req ClaimRequest) {
	r.st = TaskRunning
	delete(m.pending[r.t.Queue], r.t.ID)
	m.running[StateKey{r.t.Queue, r.t.QuotaKey}]++
	r.billed, r.runtime = 0, false
	if req.Fair {
		cost := 1.0
		if m.runtime[r.t.Queue] {
			cost = m.estimate(r.t.Queue, r.t.Key)
			r.billed, r.runtime = cost, true
		}
		m.charge(r.t.Queue, r.t.Key, req.Now, cost)
	}
}

// charge bills one claim to the key: the start tag is taken from the clock
// and the key's pass, and pass moves cost/w beyond it, so a heavier key
// pays less per claim. cost is 1, or in a queue charged by runtime the
// key's estimate in seconds.
func (m *Model) charge(queue, key string, now time.Time, cost float64) {
	rows := m.states[queue]
	if rows == nil {
		rows = map[string]KeyState{}
		m.states[queue] = rows
	}
	own := m.keyRows(queue, key)
	v := clockOf(own)
	start := startTag(own, v, key)
	rows[key] = KeyState{Pass: start + cost/m.Weight(queue, key), LastStart: start, ChargedAt: now}
	if m.twoLevel[queue] {
		m.chargeGroup(queue, GroupOf(key), now, cost)
	}
}

// chargeGroup bills one claim to a group of a two-level queue, as charge
// bills a key among all keys: the groups share the queue by their weights
// first, then each group's keys share its claims by theirs.
func (m *Model) chargeGroup(queue, group string, now time.Time, cost float64) {
	rows := m.groupStates[queue]
	if rows == nil {
		rows = map[string]KeyState{}
		m.groupStates[queue] = rows
	}
	v := clockOf(rows)
	start := startTag(rows, v, group)
	rows[group] = KeyState{Pass: start + cost/m.GroupWeight(queue, group), LastStart: start, ChargedAt: now}
}

// GroupOf is the group of a fairness key in a two-level queue: the tenant
// the gateway's key binding names it for, the part before the first "/"
// ("acme" for "acme" and "acme/k1"). The default key is a group of its own.
func GroupOf(key string) string {
	if i := strings.IndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return key
}

// SetTwoLevel turns two-level fairness on or off for a queue: with it on,
// a fair claim serves the groups (GroupOf) in start-time fair order by
// their weights first, and the keys of the chosen group in that order by
// theirs (hierarchical start-time fair queuing), so a group's share does
// not grow with the number of its keys. Priority still comes before both.
// Turning it on or off keeps the rows already charged.
func (m *Model) SetTwoLevel(queue string, on bool) {
	if on {
		m.twoLevel[queue] = true
		return
	}
	delete(m.twoLevel, queue)
}

// SetGroupWeight sets a group's weight in a two-level queue (a group
// without one weighs 1). The weight applies from the group's next charge.
func (m *Model) SetGroupWeight(queue, group string, w float64) {
	m.groupWeights[StateKey{queue, group}] = w
}

// ClearGroupWeight removes a group's weight; it weighs 1 from its next
// charge.
func (m *Model) ClearGroupWeight(queue, group string) {
	delete(m.groupWeights, StateKey{queue, group})
}

// GroupWeight returns a group's weight in the queue.
func (m *Model) GroupWeight(queue, group string) float64 {
	if w, ok := m.groupWeights[StateKey{queue, group}]; ok {
		return w
	}
	return 1
}

// GroupState returns a group's row in a two-level queue, if it has one.
func (m *Model) GroupState(queue, group string) (KeyState, bool) {
	s, ok := m.groupStates[queue][group]
	return s, ok
}

// GroupLag is a group's lag among the groups of a two-level queue: how far
// its start tag is ahead of the groups' clock.
func (m *Model) GroupLag(queue, group string) float64 {
	rows := m.groupStates[queue]
	v := clockOf(rows)
	return startTag(rows, v, group) - v
}

// ClaimByID claims one named row, as the dispatch channel does. The row
// must exist, belong to req.Queue, be pending and be due; otherwise the
// result is EmptyNoTask. Sticky, priority and lag play no part since the
// row is named, but the rechecks run (a refusal gives EmptyRefused with one
// Refusal) and a fair request charges the key like any fair claim. Lag
// reports the key's live lag at the pick.
func (m *Model) ClaimByID(id int64, req ClaimRequest) ClaimResult {
	if req.Fair {
		m.foldHeld(req.Queue)
	}
	r, ok := m.tasks[id]
	if !ok || r.st != TaskPending || r.t.Queue != req.Queue || r.t.DueAt.After(req.Now) {
		return ClaimResult{Empty: EmptyNoTask}
	}
	if reason := m.recheck(r.t, req.Now); reason != "" {
		return ClaimResult{
			Refused: []Refusal{{TaskID: id, QuotaKey: r.t.QuotaKey, Reason: reason}},
			Empty:   EmptyRefused,
		}
	}
	res := ClaimResult{Task: r.t, OK: true}
	if req.Fair {
		res.Lag = m.Lag(r.t.Queue, r.t.Key)
	}
	m.accept(r, req)
	return res
}

// Complete moves a running task to done. Any other state is left alone,
// like a fenced UPDATE that matches no row. In a queue charged by runtime
// the attempt counts as having held its worker for no time; CompleteHeld
// says how long it did.
func (m *Model) Complete(id int64) { m.CompleteHeld(id, 0) }

// CompleteHeld is Complete for an attempt that held its worker for
// heldSecs seconds: an attempt billed by runtime records it, and the next
// fair claim of the queue settles it (foldHeld).
func (m *Model) CompleteHeld(id int64, heldSecs float64) {
	r, ok := m.tasks[id]
	if !ok || r.st != TaskRunning {
		return
	}
	m.endAttempt(r, heldSecs)
	r.st = TaskDone
	m.running[StateKey{r.t.Queue, r.t.QuotaKey}]--
}

// Cancel takes a task out of play, as a cancelled run does: a pending task
// leaves the claimable set and a running one stops counting against its
// quota's concurrency cap. Neither touches fairness state: a claim already
// charged stays charged. Unknown or finished tasks are left alone.
func (m *Model) Cancel(id int64) { m.CancelHeld(id, 0) }

// CancelHeld is Cancel for a running attempt that held its worker for
// heldSecs seconds (see CompleteHeld).
func (m *Model) CancelHeld(id int64, heldSecs float64) {
	r, ok := m.tasks[id]
	if !ok {
		return
	}
	switch r.st {
	case TaskPending:
		delete(m.pending[r.t.Queue], id)
	case TaskRunning:
		m.endAttempt(r, heldSecs)
		m.running[StateKey{r.t.Queue, r.t.QuotaKey}]--
	default:
		return
	}
	r.st = TaskDone
}

// Requeue puts a running task back to pending with a new due time (a retry
// or a rescued lease). Other fields, stickiness included, are kept. Tasks
// not running are left alone. Requeueing never touches fairness state: the
// charge of the lost attempt stands, as the claim already consumed a turn.
func (m *Model) Requeue(id int64, dueAt time.Time) { m.RequeueHeld(id, dueAt, 0) }

// RequeueHeld is Requeue for an attempt that held its worker for heldSecs
// seconds (see CompleteHeld); a rescued lease held it until it expired.
func (m *Model) RequeueHeld(id int64, dueAt time.Time, heldSecs float64) {
	r, ok := m.tasks[id]
	if !ok || r.st != TaskRunning {
		return
	}
	m.endAttempt(r, heldSecs)
	r.st = TaskPending
	r.t.DueAt = dueAt
	m.running[StateKey{r.t.Queue, r.t.QuotaKey}]--
	m.pendingOf(r.t.Queue)[id] = r
}

// Prune deletes fairness rows that no longer matter and returns them sorted
// by queue, then key. Rows charged after now-window count as recent.
//
// A queue with no pending task (due or not) and no recent charge is idle:
// all its rows go, forgiving every debt and resetting its clock; with no
// one left to compete, past debts have nothing to protect. In any other
// queue a row goes
// when its key has no pending task, it is not recent, and it is not the
// clock row (greatest LastStart, ties broken by the greater key). Keeping
// the clock row means V never moves backwards in a live queue, and since a
// charge leaves pass at most 1/w past V, a pruned key forgives at most one
// claim of debt at the weight it was last charged with.
func (m *Model) Prune(now time.Time, window time.Duration) []StateKey {
	cutoff := now.Add(-window)
	var out []StateKey
	for queue, rows := range m.states {
		pendingKeys := map[string]bool{}
		for _, r := range m.pending[queue] {
			pendingKeys[r.t.Key] = true
		}
		recent := false
		clockKey, first := "", true
		var clockStart float64
		for k, s := range rows {
			if s.ChargedAt.After(cutoff) {
				recent = true
			}
			if first || s.LastStart > clockStart || (s.LastStart == clockStart && k > clockKey) {
				clockKey, clockStart, first = k, s.LastStart, false
			}
		}
		idle := len(pendingKeys) == 0 && !recent
		if m.twoLevel[queue] && !idle {
			// Which row holds each group's clock is the SQL's to settle
			// with the second level; until then a live two-level queue
			// keeps its rows.
			continue
		}
		if idle {
			delete(m.groupStates, queue)
		}
		for k, s := range rows {
			if idle || (!pendingKeys[k] && !s.ChargedAt.After(cutoff) && k != clockKey) {
				delete(rows, k)
				delete(m.heldEst, StateKey{queue, k})
				out = append(out, StateKey{queue, k})
			}
		}
		if len(rows) == 0 {
			delete(m.states, queue)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Queue != out[j].Queue {
			return out[i].Queue < out[j].Queue
		}
		return out[i].Key < out[j].Key
	})
	return out
}
