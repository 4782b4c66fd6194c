package config

import (
	"bytes"
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// unsetenv removes key for the rest of the test and puts it back after.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "") // registers the restore
	require.NoError(t, os.Unsetenv(key))
}

// A binary started without GOGC runs at DefaultGCPercent: the setting
// reaches the runtime through Binary.Start, the path of the gateway and
// the worker. Not parallel: it sets the environment and the process's
// garbage collector.
func TestBinaryStartSetsGCTargetWithoutGOGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	unsetenv(t, "GOGC")
	t.Setenv("HARVEST_TEST_BINARY_PORT", "80")

	var out, errb bytes.Buffer
	var cfg fakeCfg
	_, ok := Binary{Name: "tool"}.Start(nil, &out, &errb, &cfg)
	require.True(t, ok, errb.String())
	require.Equal(t, DefaultGCPercent, debug.SetGCPercent(100), "the target in force after Start")
}

// GOGC in the environment wins: the runtime read it at start, and TuneGC
// leaves it alone (off included).
func TestTuneGCLeavesGOGCAlone(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // what the runtime did with it at start
	TuneGC()
	require.Equal(t, 150, debug.SetGCPercent(150))

	t.Setenv("GOGC", "off")
	debug.SetGCPercent(-1)
	TuneGC()
	require.Equal(t, -1, debug.SetGCPercent(100))

	unsetenv(t, "GOGC")
	TuneGC()
	require.Equal(t, DefaultGCPercent, debug.SetGCPercent(100))
}
