package shards

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHomeIsStableAndInRange(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 8; n++ {
		for i := 0; i < 200; i++ {
			tenant := fmt.Sprintf("tenant-%d", i)
			h := Home(tenant, n)
			require.GreaterOrEqual(t, h, 0)
			require.Less(t, h, n)
			require.Equal(t, h, Home(tenant, n))
		}
	}
}

// These values are part of the contract: a change would move tenants' runs.
func TestHomeKnownValues(t *testing.T) {
	t.Parallel()
	got := []int{Home("acme", 2), Home("globex", 2), Home("initech", 3), Home("umbrella", 4)}
	require.Equal(t, []int{0, 1, 1, 3}, got)
}

func TestAddingAShardMovesFewTenants(t *testing.T) {
	t.Parallel()
	const tenants = 10000
	for n := 2; n <= 6; n++ {
		moved, toNew := 0, 0
		for i := 0; i < tenants; i++ {
			tenant := fmt.Sprintf("t%d", i)
			before, after := Home(tenant, n), Home(tenant, n+1)
			if before != after {
				moved++
				require.Equal(t, n, after, "a tenant may only move to the new shard")
				toNew++
			}
		}
		want := tenants / (n + 1)
		require.InDelta(t, want, moved, float64(want)*0.15, "n=%d: moved %d, expected about %d", n, moved, want)
		require.Equal(t, moved, toNew)
	}
}

func TestHomeSpreadsEvenly(t *testing.T) {
	t.Parallel()
	const n, tenants = 4, 20000
	counts := make([]int, n)
	for i := 0; i < tenants; i++ {
		counts[Home(fmt.Sprintf("tenant-%d", i), n)]++
	}
	for i, c := range counts {
		require.InDelta(t, tenants/n, c, tenants/n*0.1, "shard %d got %d", i, c)
	}
}
