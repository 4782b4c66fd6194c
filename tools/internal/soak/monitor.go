package soak

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/harvest-run/harvest/internal/pgrow"
)

// Defaults of the monitor.
const (
	// pairSampleEvery is how often the monitor reads whether both keys of
	// the weighted pair have work.
	pairSampleEvery = 100 * time.Millisecond
	// admissionSampleEvery is how often it reads each shard's unfinished
	// runs against the capacity the shard holds.
	admissionSampleEvery = time.Second
	// minStretchClaims is the fewest pair claims a stretch needs to be
	// judged: a shorter one says nothing about shares.
	minStretchClaims = 50
	// urgentSlack is how long after its start's acknowledgement an urgent
	// run may still lose claims to lower work (a claim whose snapshot
	// predates the start), and how long before its execution was seen it
	// may have been claimed.
	urgentSlack = 2 * time.Second
)

// Monitor checks promises while the soak runs, not only at the end: on the
// shard of the first tenant it watches the weighted pair share the claims
// (whenever both have work) and the priority band go first; on every shard
// it reads the unfinished runs against the admission capacity the shard
// holds, and on shard 0 the ledger against the system limit.
//
// Claims are counted as the harness sees the pair's probe executions, so a
// stretch's edges can misplace the claims in flight: edge is that
// allowance, the tasks one claim statement of each worker of the shard can
// take.
type Monitor struct {
	f     *Fleet
	edge  int
	began time.Time

	shard atomic.Int64 // -1 until the first watched start is acknowledged

	mu       sync.Mutex
	pairExec map[string]int64       // key -> executions
	pairAt   []time.Time            // every pair execution, in order seen
	urgentN  int64                  // urgent executions
	urgentAt map[string]time.Time   // run -> acknowledgement
	urgentEx map[string]time.Time   // run -> first execution, attempt 1
	stretch  *stretch               // the stretch in progress
	judged   []stretch              // stretches long enough to judge
	short    int                    // stretches too short to say anything
	admBad   []string               // admission violations
	windows  map[int]*windowSummary // window index -> summary
	done     chan struct{}
	wg       sync.WaitGroup
}

// stretch is a time in which both keys of the pair had work throughout.
type stretch struct {
	from, to     time.Duration
	heavy, light int64 // claims in the stretch
	urgent       int64 // urgent claims in it: each may move the fair clock
	// The counters when the stretch began.
	startH, startL, startU int64
}

// excess is how far the stretch is from the pair's weights, in claims
// over weight: 0 is exact.
func (s stretch) excess() float64 {
	return math.Abs(float64(s.heavy)/PairWeight - float64(s.light))
}

// bound is the claim's pair bound, 1/w_heavy + 1/w_light, once for the
// stretch and once more for each urgent claim in it (a claim out of fair
// order can move the clock and restart the bound), plus the edge.
func (m *Monitor) bound(s stretch) float64 {
	return float64(s.urgent+1)*(1/PairWeight+1) + 2*float64(m.edge)
}

// windowSummary is one minute of the monitor's findings.
type windowSummary struct {
	stretches         int
	heavy, light      int64
	worstExcess       float64
	worstBound        float64
	maxUnfinished     int
	admissionFailures int
}

// NewMonitor starts a monitor on f. edge is the claims one statement of
// every worker of a shard can take (workers per shard times the batch).
func NewMonitor(f *Fleet, edge int) *Monitor {
	m := &Monitor{f: f, edge: edge, began: time.Now(), pairExec: map[string]int64{},
		urgentAt: map[string]time.Time{}, urgentEx: map[string]time.Time{}, windows: map[int]*windowSummary{},
		done: make(chan struct{})}
	m.shard.Store(-1)
	f.evMu.Lock()
	f.monitor = m
	f.evMu.Unlock()
	m.wg.Add(2)
	go m.pairLoop()
	go m.admissionLoop()
	return m
}

// Stop ends the sampling.
func (m *Monitor) Stop() {
	select {
	case <-m.done:
	default:
		close(m.done)
	}
	m.wg.Wait()
}

func (m *Monitor) window(at time.Duration) *windowSummary {
	i := int(at / time.Minute)
	w := m.windows[i]
	if w == nil {
		w = &windowSummary{}
		m.windows[i] = w
	}
	return w
}

// watched notes the shard of a watched start.
func (m *Monitor) watched(shard int) { m.shard.CompareAndSwap(-1, int64(shard)) }

func (m *Monitor) urgentAcked(run string, shard int) {
	m.watched(shard)
	m.mu.Lock()
	m.urgentAt[run] = time.Now()
	m.mu.Unlock()
}

// executed is called by the probe handler for a watched key's execution.
func (m *Monitor) executed(key, run string, attempt int) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch key {
	case PairHeavy, PairLight:
		m.pairExec[key]++
		m.pairAt = append(m.pairAt, now)
	case UrgentKey:
		m.urgentN++
		if attempt == 1 {
			if _, seen := m.urgentEx[run]; !seen {
				m.urgentEx[run] = now
			}
		}
	}
}

func (m *Monitor) pairLoop() {
	defer m.wg.Done()
	t := time.NewTicker(pairSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			m.mu.Lock()
			m.endStretch(time.Since(m.began))
			m.mu.Unlock()
			return
		case <-t.C:
		}
		s := m.shard.Load()
		if s < 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var both bool
		err := m.f.direct[s].QueryRow(ctx, `SELECT count(*) = 2 FROM fair_state
			WHERE queue = $1 AND key IN ($2, $3) AND head_id IS NOT NULL AND head_prio = 0`,
			Queue, PairHeavy, PairLight).Scan(&both)
		cancel()
		at := time.Since(m.began)
		m.mu.Lock()
		switch {
		case err != nil || !both:
			// A sample that cannot be read ends the stretch: nothing is
			// known of the time since.
			m.endStretch(at)
		case m.stretch == nil:
			m.stretch = &stretch{from: at, startH: m.pairExec[PairHeavy], startL: m.pairExec[PairLight], startU: m.urgentN}
		case int(at/time.Minute) != int(m.stretch.from/time.Minute):
			// A stretch is cut at each minute, so that each minute of the
			// report judges its own.
			m.endStretch(at)
			m.stretch = &stretch{from: at, startH: m.pairExec[PairHeavy], startL: m.pairExec[PairLight], startU: m.urgentN}
		default:
			m.stretch.to = at
			m.stretch.heavy = m.pairExec[PairHeavy] - m.stretch.startH
			m.stretch.light = m.pairExec[PairLight] - m.stretch.startL
			m.stretch.urgent = m.urgentN - m.stretch.startU
		}
		m.mu.Unlock()
	}
}

// endStretch closes the stretch in progress (m.mu held).
func (m *Monitor) endStretch(at time.Duration) {
	s := m.stretch
	m.stretch = nil
	if s == nil || s.heavy+s.light < minStretchClaims {
		return
	}
	// A stretch too short for an even split of the pair to break its
	// bound says nothing about the weights: count it, do not judge it.
	n := float64(s.heavy + s.light)
	if n*math.Abs(1-(PairWeight+1)/(2*PairWeight)) <= m.bound(*s) {
		m.short++
		return
	}
	m.judged = append(m.judged, *s)
	w := m.window(s.from)
	w.stretches++
	w.heavy += s.heavy
	w.light += s.light
	if s.excess() > w.worstExcess {
		w.worstExcess, w.worstBound = s.excess(), m.bound(*s)
	}
}

func (m *Monitor) admissionLoop() {
	defer m.wg.Done()
	t := time.NewTicker(admissionSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		}
		m.sampleAdmission()
	}
}

// sampleAdmission reads, on each shard in one snapshot, the unfinished runs
// and the capacity the shard holds, and the ledger on shard 0. A shard
// cut off by a fault is skipped: the harness reads it directly, so that is
// rare.
func (m *Monitor) sampleAdmission() {
	at := time.Since(m.began)
	total := 0
	var bad []string
	for s, p := range m.f.direct {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		type counts struct {
			Unfinished int `db:"unfinished"`
			Held       int `db:"held"`
		}
		c, err := pgrow.One[counts](ctx, p, `SELECT (SELECT count(*) FROM runs WHERE finished_at IS NULL) AS unfinished,
			(SELECT granted - returned FROM admission_lease) AS held`)
		n, held := c.Unfinished, c.Held
		if err == nil && s == 0 {
			var ledger int
			if err = p.QueryRow(ctx, `SELECT coalesce(sum(granted - returned), 0) FROM admission_ledger`).Scan(&ledger); err == nil && ledger > m.f.opts.MaxRuns {
				bad = append(bad, fmt.Sprintf("at %s the ledger granted %d, over the limit of %d", at.Round(time.Second), ledger, m.f.opts.MaxRuns))
			}
		}
		cancel()
		if err != nil {
			continue
		}
		if n > held {
			bad = append(bad, fmt.Sprintf("at %s shard %d held %d unfinished runs on a lease of %d", at.Round(time.Second), s, n, held))
		}
		total += n
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.window(at)
	w.maxUnfinished = max(w.maxUnfinished, total)
	w.admissionFailures += len(bad)
	m.admBad = append(m.admBad, bad...)
	if total > m.f.opts.MaxRuns {
		m.admBad = append(m.admBad, fmt.Sprintf("at %s the shards held %d unfinished runs, over the limit of %d", at.Round(time.Second), total, m.f.opts.MaxRuns))
	}
}

// MonitorReport is what the monitor found.
type MonitorReport struct {
	Stretches        int
	ShortStretches   int // too short for an even split to break the bound
	PairClaims       int64
	HeavyShare       float64 // of the pair's claims in the stretches
	UrgentRuns       int     // urgent runs judged (first executed at attempt 1)
	UrgentWaitP50    time.Duration
	UrgentWaitP99    time.Duration
	MaxUnfinished    int
	Limit            int
	Violations       []string
	windows          map[int]windowSummary
	urgentByMinute   map[int][]time.Duration // acknowledgement to execution, by minute of the acknowledgement
	bound            func(stretch) float64
	judged           []stretch
	edge             int
	urgentViolations int
}

// Report judges what was seen: each stretch against the pair bound, each
// urgent run against the lower claims made while it waited, and the
// admission samples.
func (m *Monitor) Report() MonitorReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A copy of the windows: the report is read (and its urgent waits
	// sorted) after the lock is released, and Report may be called again.
	windows := make(map[int]windowSummary, len(m.windows))
	for i, w := range m.windows {
		windows[i] = *w
	}
	r := MonitorReport{Limit: m.f.opts.MaxRuns, windows: windows, urgentByMinute: map[int][]time.Duration{},
		bound: m.bound, judged: m.judged, edge: m.edge, ShortStretches: m.short}
	var h int64
	for _, s := range m.judged {
		r.Stretches++
		r.PairClaims += s.heavy + s.light
		h += s.heavy
		if s.excess() > m.bound(s) {
			r.Violations = append(r.Violations, fmt.Sprintf("weights: from %s to %s the pair took %d heavy and %d light claims (weight %g): %.1f claims over weight apart, the bound is %.1f",
				s.from.Round(100*time.Millisecond), s.to.Round(100*time.Millisecond), s.heavy, s.light, PairWeight, s.excess(), m.bound(s)))
		}
	}
	if r.PairClaims > 0 {
		r.HeavyShare = float64(h) / float64(r.PairClaims)
	}
	// Priority: the pair's claims seen while an urgent run waited.
	at := slices.Clone(m.pairAt)
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	var waits []time.Duration
	for run, ex := range m.urgentEx {
		ack, ok := m.urgentAt[run]
		if !ok {
			continue
		}
		r.UrgentRuns++
		waits = append(waits, ex.Sub(ack))
		i := int(ack.Sub(m.began) / time.Minute)
		r.urgentByMinute[i] = append(r.urgentByMinute[i], ex.Sub(ack))
		from, to := ack.Add(urgentSlack), ex.Add(-urgentSlack)
		if !to.After(from) {
			continue
		}
		lo, _ := slices.BinarySearchFunc(at, from, func(a, b time.Time) int { return a.Compare(b) })
		hi, _ := slices.BinarySearchFunc(at, to, func(a, b time.Time) int { return a.Compare(b) })
		if n := hi - lo; n > m.edge {
			r.urgentViolations++
			if r.urgentViolations <= 10 {
				r.Violations = append(r.Violations, fmt.Sprintf("priority: urgent run %s waited %s, and %d priority-0 pair claims were made in it",
					run, ex.Sub(ack).Round(time.Millisecond), n))
			}
		}
	}
	if r.urgentViolations > 10 {
		r.Violations = append(r.Violations, fmt.Sprintf("priority: %d more urgent runs like those", r.urgentViolations-10))
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	r.UrgentWaitP50, r.UrgentWaitP99 = quantile(waits, 0.5), quantile(waits, 0.99)
	for _, w := range windows {
		r.MaxUnfinished = max(r.MaxUnfinished, w.maxUnfinished)
	}
	r.Violations = append(r.Violations, m.admBad...)
	return r
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// String is the monitor's part of the soak report: a line of totals and a
// row per minute.
func (r MonitorReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "during the run: %d stretches judged with both pair keys backlogged (%d more too short to judge), %d claims, heavy share %.1f%% (weights %g:1 give %.1f%%); edge allowance %d claims\n",
		r.Stretches, r.ShortStretches, r.PairClaims, 100*r.HeavyShare, PairWeight, 100*PairWeight/(PairWeight+1), r.edge)
	fmt.Fprintf(&b, "priority band: %d urgent runs judged, wait from acknowledgement to execution p50 %s, p99 %s\n",
		r.UrgentRuns, r.UrgentWaitP50.Round(time.Millisecond), r.UrgentWaitP99.Round(time.Millisecond))
	fmt.Fprintf(&b, "admission: at most %d unfinished runs over the shards (limit %d)\n", r.MaxUnfinished, r.Limit)
	idx := make([]int, 0, len(r.windows))
	for i := range r.windows {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	tw := tabwriter.NewWriter(&b, 1, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "minute\tstretches\tpair claims\theavy share\tworst excess / bound\turgent p99 ms\tmax unfinished\tadmission faults\t")
	for _, i := range idx {
		w := r.windows[i]
		share, worst := "-", "-"
		if w.heavy+w.light > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(w.heavy)/float64(w.heavy+w.light))
			worst = fmt.Sprintf("%.1f / %.1f", w.worstExcess, w.worstBound)
		}
		waits := r.urgentByMinute[i]
		sort.Slice(waits, func(a, c int) bool { return waits[a] < waits[c] })
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t\n", i, w.stretches, w.heavy+w.light, share, worst,
			quantile(waits, 0.99).Milliseconds(), w.maxUnfinished, w.admissionFailures)
	}
	_ = tw.Flush()
	return b.String()
}
