package fleetbench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentilesAreNearestRank(t *testing.T) {
	var v []float64
	for i := 1; i <= 100; i++ {
		v = append(v, float64(i))
	}
	require.Equal(t, 50.0, pct(v, 50))
	require.Equal(t, 99.0, pct(v, 99))
	require.Equal(t, 0.0, pct(nil, 99))
	require.Equal(t, 7.0, pct([]float64{7}, 99))
}

func TestPeakRSSReadsThisProcess(t *testing.T) {
	mb := peakRSS(os.Getpid())
	require.Greater(t, mb, 1.0)
	require.Less(t, mb, 4096.0)
	require.Zero(t, peakRSS(-1))
}

func TestTableAndChart(t *testing.T) {
	on, off := true, false
	results := []Result{
		{System: "harvest", Pair: 1, Fair: &on, Slots: 100, TasksPerS: 3000, WorkerRSSMB: []float64{30, 31}, GatewayRSSMB: 24,
			perSecond: map[string][]int{floodKey: {2900, 3100, 3000}, lightKey: {0, 1, 1}}},
		{System: "river", Pair: 1, Slots: 100, TasksPerS: 1000, PeakRSSMB: 28},
		{System: "harvest", Pair: 1, Fair: &off, Slots: 100, TasksPerS: 3100,
			perSecond: map[string][]int{floodKey: {3100, 3100, 3000}, lightKey: {0, 0, 0, 3}}},
	}
	pairs := []PairResult{{Pair: 1, HarvestFair: 3000, HarvestOff: 3100, River: 1000, VsRiver: 3, FairCostPct: 3.2}}
	var buf bytes.Buffer
	WriteTable(&buf, results, pairs)
	out := buf.String()
	require.Contains(t, out, "harvest")
	require.Contains(t, out, "river")
	require.Contains(t, out, "30.0, 31.0; 24.0")
	require.Equal(t, 2, strings.Count(out, "round"))

	path := filepath.Join(t.TempDir(), "keys.svg")
	require.NoError(t, KeyChart(path, &results[0], &results[2]))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), "<svg")
	require.Contains(t, string(b), "fairness off")
	// A missing run still gives a chart (its panel is empty).
	require.NoError(t, KeyChart(path, nil, &results[2]))
}

// The light-waits file puts the drain's checkpoints and analyzes on the
// light runs' clock, without those that came before the drain: the
// checkpoint done before it, one under way when it began, the fleet's
// own analyze of the shard.
func TestLightEventsOnTheDrainsClock(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 6, 54, 9, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	l := lightLog{T0: t0}
	n := l.addEvents(at(-0.2), []time.Time{at(-20), at(-5), at(29), at(63)},
		map[time.Time]bool{at(-0.5): true, at(62.4): true, at(61.7): true})
	require.Equal(t, 2, n)
	require.Equal(t, []float64{29, 63}, l.CheckpointsS)
	require.Equal(t, []float64{61.7, 62.4}, l.AnalyzesS)

	none := lightLog{T0: t0}
	require.Zero(t, none.addEvents(at(-0.2), nil, nil), "a role that may not read the checkpoints")
	require.NotNil(t, none.CheckpointsS, "written as [], not null")
	require.Empty(t, none.CheckpointsS)
}
