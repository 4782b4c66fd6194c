package admissionchart

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

func TestLimitsFollowTheAlgorithms(t *testing.T) {
	t.Parallel()
	o := Options{MaxRuns: 128, Tenants: 8}
	dyn := Limits(tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 3}, o)
	require.Len(t, dyn, 129)
	require.Equal(t, 24.0, dyn[120].Y)
	require.Equal(t, 0.0, dyn[128].Y)
	st := Limits(tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}, o)
	require.Equal(t, 16.0, st[0].Y)
	require.Equal(t, 16.0, st[128].Y)
	nl := Limits(tenantcap.DefaultConfig(), o)
	require.Equal(t, 128.0, nl[64].Y)
}

// The committed picture is what the generator draws today.
func TestCommittedChartIsCurrent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	require.NoError(t, WriteSVG(&buf, Options{MaxRuns: tenantcap.DefaultMaxRuns, Tenants: 8}, DefaultSeries()))
	require.Contains(t, buf.String(), "<svg")
	committed, err := os.ReadFile("../../docs/admission-limits.svg")
	require.NoError(t, err, "run: go -C tools run ./cmd/admission-chart -out ../docs/admission-limits.svg")
	require.Equal(t, string(committed), buf.String(), "stale: go -C tools run ./cmd/admission-chart -out ../docs/admission-limits.svg")
}
