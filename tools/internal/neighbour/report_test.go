package neighbour

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The percentiles are nearest-rank: the p-th of n values is the
// ceil(n*p/100)-th smallest, so with 100 values p99 is the 99th and not
// the largest, and with few values the high ones are the largest.
func TestSummarizeIsNearestRank(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var hundred []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, ms(i))
	}
	require.Equal(t, Waits{N: 100, P50: ms(50), P95: ms(95), P99: ms(99), Max: ms(100)}, summarize(hundred))
	require.Equal(t, ms(100), hundred[0], "summarize sorts a copy")

	require.Equal(t, Waits{N: 3, P50: ms(2), P95: ms(3), P99: ms(3), Max: ms(3)}, summarize([]time.Duration{ms(3), ms(1), ms(2)}))
	require.Equal(t, Waits{}, summarize(nil))
}

// A low run counts as early only when claimed strictly before the last
// high run, and as claimed while the flood was starting only when claimed
// before the last high run was created.
func TestOwnOrderCountsLowClaimsBeforeTheLastHigh(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	claims := []claim{
		{0, at(0), at(0)},
		{-10, at(0), at(5)}, // early, before the last high run was created at 8
		{0, at(8), at(10)},
		{-10, at(0), at(12)}, // early, after it
		{0, at(1), at(20)},
		{-10, at(0), at(20)}, // claimed at the same time as the last high: not early
		{-10, at(0), at(30)},
	}
	require.Equal(t, OwnOrder{High: 0, Low: -10, Highs: 3, Lows: 4, Early: 2, Starting: 1}, ownOrder(claims, 0, -10))
	require.Equal(t, OwnOrder{High: 0, Low: -10}, ownOrder(nil, 0, -10))
}

// The report names the refusals with their counts, the fallback flood's
// priorities, the waits and the own-order figure.
func TestReportStatesTheFigures(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	r := Result{
		Command: "harvest-bench neighbour", Heavy: "acme", Light: "globex", Queue: "default", MS: 200, Batch: 500,
		Every: 100 * time.Millisecond, HeavyShard: 0, LightShard: 0, LoadStart: "1.00 2.00 3.00", LoadEnd: "1.50 2.00 3.00",
		Floods: []Flood{
			{Priorities: []int{1000}, Sent: 3000, Refused: map[string]int{"403 permission_denied field priority": 3000}},
			{Priorities: []int{0, -10}, Sent: 3000, Accepted: 3000, Refused: map[string]int{}},
		},
		Drain:        12345 * time.Millisecond,
		LightStarted: 120,
		Waits:        Waits{N: 120, P50: ms(12), P95: ms(300), P99: 1234 * time.Millisecond, Max: 1300 * time.Millisecond},
		Own:          &OwnOrder{High: 0, Low: -10, Highs: 1500, Lows: 1500, Early: 2, Starting: 2},
	}
	require.Equal(t, `command: harvest-bench neighbour
load average (1, 5, 15 min): 1.00 2.00 3.00 before, 1.50 2.00 3.00 after
flood: acme started 3000 sleep runs of 200 ms on "default" in batches of 500 at priority 1000: 0 accepted, 3000 refused (403 permission_denied field priority: 3000)
flood: acme started 3000 sleep runs of 200 ms on "default" in batches of 500 at priority 0 and -10 (alternating): 3000 accepted
the flood drained 12.3s after its first start
light: globex started 120 plain runs (priority 0), one every 100ms until the flood drained
light waits, start to claim (database clock), 120 runs: p50 12ms  p95 300ms  p99 1.23s  max 1.3s
own order: 2 of acme's 1500 runs at priority -10 were claimed before the last of its 1500 at priority 0, 2 of them while the flood was still being started
`, r.String())
}
