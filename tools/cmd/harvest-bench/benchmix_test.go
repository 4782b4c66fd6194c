package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// harvest-bench mix refuses a ramp it cannot run before it starts
// anything, naming the flag. (Not parallel: it points the benchmark at a
// server that does not exist, so that a check that let a bad flag through
// fails at once instead of running a benchmark.)
func TestMixFlagsAreChecked(t *testing.T) {
	t.Setenv("HARVEST_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	for name, args := range map[string][]string{
		"--rate":       {"mix", "--rate", "0"},
		"--ramp-step":  {"mix", "--ramp-step", "-1"},
		"--ramp-every": {"mix", "--ramp-every", "0s"},
		"--minutes":    {"mix", "--minutes", "0.5", "--ramp-every", "45s"},
		"--wait-bound": {"mix", "--wait-bound", "0s"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, exitUsage, run(args, &stdout, &stderr), "%v: %s", args, stderr.String())
		require.Contains(t, stderr.String(), name)
	}
}
