package workerbin

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

// profileEnv names a file the worker writes a CPU profile of its whole
// life to (for benchmarks: harvest-bench fleet -profile). It is read
// directly rather than through the configuration, being a diagnostic.
const profileEnv = "HARVEST_WORKER_CPU_PROFILE"

// startProfile starts the CPU profile when HARVEST_WORKER_CPU_PROFILE is
// set and returns the function that stops it and closes the file.
func startProfile(stderr io.Writer) func() {
	path := os.Getenv(profileEnv)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(stderr, "worker: %s: %v\n", profileEnv, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(stderr, "worker: %s: %v\n", profileEnv, err)
		_ = f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}
