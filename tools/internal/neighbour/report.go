package neighbour

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Waits sums up the light tenant's waits from start to claim.
type Waits struct {
	N                  int
	P50, P95, P99, Max time.Duration
}

// summarize returns the nearest-rank percentiles of ds (left unsorted).
func summarize(ds []time.Duration) Waits {
	s := slices.Clone(ds)
	slices.Sort(s)
	w := Waits{N: len(s), P50: percentile(s, 50), P95: percentile(s, 95), P99: percentile(s, 99)}
	if len(s) > 0 {
		w.Max = s[len(s)-1]
	}
	return w
}

// percentile is the nearest-rank p-th percentile (1 to 100) of sorted: the
// smallest value that at least p% of the values do not exceed.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// Flood is one flood of the heavy tenant's starts.
type Flood struct {
	// Priorities are the priorities of its runs in turn: run i has
	// Priorities[i%len(Priorities)].
	Priorities []int
	Sent       int
	Accepted   int
	// Refused counts the refused starts by answer, such as
	// "403 permission_denied field priority".
	Refused map[string]int
}

// OwnOrder is how the heavy tenant's own priorities ordered its claims.
type OwnOrder struct {
	High, Low   int // the two priorities
	Highs, Lows int // how many runs of each were claimed
	// Early is how many of the Low runs were claimed before the last High
	// one (by the database clock), and Starting how many of those were
	// claimed before the last High run was created: while the flood was
	// still being started, the worker took the Low runs already there
	// rather than wait for High ones not written yet.
	Early, Starting int
}

// claim is when one run of a priority was created and first claimed.
type claim struct {
	priority    int
	created, at time.Time
}

// ownOrder counts the claims of priority low that came strictly before
// the last claim of priority high. A low run claimed later in the same
// statement as the last high ones does not count: the claim stamps its rows
// in the order it takes them.
func ownOrder(claims []claim, high, low int) OwnOrder {
	o := OwnOrder{High: high, Low: low}
	var last, lastCreated time.Time
	for _, c := range claims {
		if c.priority == high {
			o.Highs++
			if c.at.After(last) {
				last = c.at
			}
			if c.created.After(lastCreated) {
				lastCreated = c.created
			}
		}
	}
	for _, c := range claims {
		if c.priority == low {
			o.Lows++
			if c.at.Before(last) {
				o.Early++
				if c.at.Before(lastCreated) {
					o.Starting++
				}
			}
		}
	}
	return o
}

// Result is what one run of the benchmark saw.
type Result struct {
	Command      string
	Heavy, Light string
	Queue        string
	MS, Batch    int
	Every, For   time.Duration
	// Raised is the ceiling the administrator gave the heavy tenant for
	// the run (--raise), or nil.
	Raised *int
	// Floods are the heavy tenant's floods: the one asked for and, when
	// that one was refused, the one at its fallback priorities.
	Floods []Flood
	// Drain is from the first start of the last flood until none of the
	// heavy tenant's runs was queued or running (to the watcher's poll).
	Drain time.Duration
	// LightStarted is how many starts the light tenant sent; LightRefused
	// counts the refused ones by answer.
	LightStarted int
	LightRefused map[string]int
	Waits        Waits
	// Own is set when the last flood mixed two priorities.
	Own *OwnOrder
	// HeavyShard and LightShard are the shards the runs landed on (-1:
	// none seen). Fairness is per shard, so they should be equal.
	HeavyShard, LightShard int
	// LoadStart and LoadEnd are the machine's load averages before and
	// after, to judge whether other work disturbed the figures.
	LoadStart, LoadEnd string
}

// String is the report: the command, what each tenant did and what the
// light tenant waited.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "command: %s\n", r.Command)
	if r.LoadStart != "" || r.LoadEnd != "" {
		fmt.Fprintf(&b, "load average (1, 5, 15 min): %s before, %s after\n", r.LoadStart, r.LoadEnd)
	}
	if r.Raised != nil {
		fmt.Fprintf(&b, "the administrator raised the priority ceiling of %s to %d for the run (cleared afterwards)\n", r.Heavy, *r.Raised)
	}
	for _, f := range r.Floods {
		fmt.Fprintf(&b, "flood: %s started %d sleep runs of %d ms on %q in batches of %d at priority %s: %d accepted",
			r.Heavy, f.Sent, r.MS, r.Queue, r.Batch, priorities(f.Priorities), f.Accepted)
		if n := total(f.Refused); n > 0 {
			fmt.Fprintf(&b, ", %d refused (%s)", n, answers(f.Refused))
		}
		b.WriteString("\n")
	}
	if len(r.Floods) > 0 && r.Floods[len(r.Floods)-1].Accepted > 0 {
		fmt.Fprintf(&b, "the flood drained %s after its first start\n", round(r.Drain))
	}
	until := "until the flood drained"
	if r.For > 0 {
		until = "for " + r.For.String()
	}
	fmt.Fprintf(&b, "light: %s started %d plain runs (priority 0), one every %s %s", r.Light, r.LightStarted, r.Every, until)
	if n := total(r.LightRefused); n > 0 {
		fmt.Fprintf(&b, "; %d refused (%s)", n, answers(r.LightRefused))
	}
	b.WriteString("\n")
	w := r.Waits
	fmt.Fprintf(&b, "light waits, start to claim (database clock), %d runs: p50 %s  p95 %s  p99 %s  max %s\n",
		w.N, round(w.P50), round(w.P95), round(w.P99), round(w.Max))
	if o := r.Own; o != nil {
		fmt.Fprintf(&b, "own order: %d of %s's %d runs at priority %d were claimed before the last of its %d at priority %d, %d of them while the flood was still being started\n",
			o.Early, r.Heavy, o.Lows, o.Low, o.Highs, o.High, o.Starting)
	}
	if r.HeavyShard >= 0 && r.LightShard >= 0 && r.HeavyShard != r.LightShard {
		fmt.Fprintf(&b, "warning: %s's runs are on shard %d and %s's on shard %d; fairness is per shard, so they do not compete\n",
			r.Heavy, r.HeavyShard, r.Light, r.LightShard)
	}
	return b.String()
}

// priorities writes ps as "1000" or "0 and -10 (alternating)".
func priorities(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p)
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s, " and ") + " (alternating)"
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// answers writes the refusals in a stable order: "403 permission_denied
// field priority: 3000".
func answers(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(s, "; ")
}

// round keeps three significant figures or so: 11.3s, 1.24s, 45ms.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}
