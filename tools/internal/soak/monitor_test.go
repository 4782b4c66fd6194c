package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The monitor judges a stretch against the pair bound plus its edge
// allowance, skips one too short for an even split to break that bound,
// and flags an urgent run that waited while the pair was claimed.
func TestMonitorJudgesStretchesAndUrgentWaits(t *testing.T) {
	t.Parallel()
	m := &Monitor{f: &Fleet{opts: Options{MaxRuns: 100}}, edge: 10, began: time.Now(),
		pairExec: map[string]int64{}, urgentAt: map[string]time.Time{}, urgentEx: map[string]time.Time{},
		windows: map[int]*windowSummary{}}
	judge := func(heavy, light, urgent int64) {
		m.stretch = &stretch{from: time.Second, to: 2 * time.Second, heavy: heavy, light: light, urgent: urgent}
		m.endStretch(2 * time.Second)
	}
	judge(800, 200, 0) // the weights exactly
	judge(780, 220, 3) // 25 apart, bound (3+1)*1.25 + 20 = 25
	judge(500, 500, 0) // an even split: 375 apart
	judge(40, 40, 0)   // 30 apart, bound 1.25 + 20: judged, and broken
	judge(28, 28, 0)   // 21 apart: an even split passes, too short to judge
	judge(20, 20, 0)   // under minStretchClaims: not even counted
	r := m.Report()
	require.Equal(t, 4, r.Stretches)
	require.Equal(t, 1, r.ShortStretches)
	require.Len(t, r.Violations, 2, "%v", r.Violations)
	require.Contains(t, r.Violations[0], "500 heavy and 500 light")
	require.Contains(t, r.Violations[1], "40 heavy and 40 light")

	// Urgent: one waited 5s while 30 pair claims were seen in it (edge
	// 10), one waited as long with no pair claim in its wait.
	ack := m.began.Add(10 * time.Second)
	m.urgentAt["acme/u1"], m.urgentEx["acme/u1"] = ack, ack.Add(5*time.Second)
	m.urgentAt["acme/u2"], m.urgentEx["acme/u2"] = ack.Add(20*time.Second), ack.Add(25*time.Second)
	for i := range 30 {
		m.pairAt = append(m.pairAt, ack.Add(2*time.Second+time.Duration(i)*10*time.Millisecond))
	}
	r = m.Report()
	require.Equal(t, 2, r.UrgentRuns)
	require.Len(t, r.Violations, 3, "%v", r.Violations)
	require.Contains(t, r.Violations[2], "urgent run acme/u1 waited 5s, and 30 priority-0 pair claims")
}
