package fleetbench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
