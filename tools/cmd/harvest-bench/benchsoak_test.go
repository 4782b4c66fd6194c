package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The soak starts its fleet as this program in a role: each command must
// name a benchmark of this program.
func TestSoakFleetCommandsNameABenchmark(t *testing.T) {
	t.Parallel()
	bins := soakBinaries("/bin/harvest-bench")
	for _, c := range [][]string{bins.Gateway.Args, bins.Worker.Args} {
		require.NotEmpty(t, c)
		_, ok := benchmarks()[c[0]]
		require.True(t, ok, "%q is not a benchmark of harvest-bench", c[0])
		require.Contains(t, c, "--role")
	}
}
