package config

import (
	"os"
	"runtime/debug"
)

// DefaultGCPercent is the garbage collector's target (what GOGC sets) of
// the Harvest binaries when the environment does not set GOGC.
//
// Go's own default, 100, collects each time the heap doubles. A worker's
// live heap is a few MiB while it allocates tens of MiB a second in a
// flood (claimed rows, spans, run events), so at 100 it collected many
// times a second: the garbage collector took about two fifths of the
// worker's and gateway's CPU, on the same cores as the database (docs/
// benchmarks.md, "The garbage collector's target"). At 400 the heap may
// grow to five times its live size before a collection: a few tens of MiB
// more of memory for a worker, and CPU given back to the claims.
const DefaultGCPercent = 400

// TuneGC applies DefaultGCPercent unless GOGC is set in the environment,
// which always wins (GOGC=off included).
func TuneGC() {
	if v, set := os.LookupEnv("GOGC"); set && v != "" {
		return
	}
	debug.SetGCPercent(DefaultGCPercent)
}
