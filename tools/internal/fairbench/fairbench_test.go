package fairbench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A small run of the keys scenario: with two-level off the tenant of many
// keys takes nearly every claim; with it on the one-key tenant gets about
// half. Shares depend on the claim order, not on the machine's speed.
func TestKeysScenarioSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("a benchmark run")
	}
	server := os.Getenv("HARVEST_DATABASE_URL")
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	sc := Scenario{Name: "keys", TwoLevel: true, Tenants: []Tenant{
		{Name: "many", Keys: 20, Hold: time.Millisecond, Backlog: 20000},
		{Name: "one", Keys: 1, Hold: time.Millisecond, Backlog: 20000},
	}}
	rs, err := Run(context.Background(), Config{ServerURL: server, Scenarios: []Scenario{sc}, Workers: 2, Slots: 4,
		Warmup: 500 * time.Millisecond, Window: 3 * time.Second})
	require.NoError(t, err)
	require.Len(t, rs, 2)
	off, on := rs[0], rs[1]
	require.Greater(t, off.ClaimsPerS, 0.0)
	require.Empty(t, off.RanDry)
	require.Empty(t, on.RanDry)
	require.Less(t, off.ClaimShare["one"], 0.15, "one level: one share in 21")
	require.InDelta(t, 0.5, on.ClaimShare["one"], 0.1, "two-level: half")
	require.NoError(t, WriteChart(filepath.Join(t.TempDir(), "c.svg"), []Scenario{sc}, rs))
}
