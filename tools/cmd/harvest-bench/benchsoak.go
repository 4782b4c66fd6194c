package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// runBenchSoak is harvest-bench soak: a fleet of gateway and worker
// processes (this binary, re-executed in the role of each) under a mixed
// load with random faults, then the invariant report and memory over time.
func runBenchSoak(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "soak", "soak [--minutes 15] [--fault-every 20s] [--rate 10] [--ramp-step N --ramp-every 1m] [--seed N]")
	minutes := fs.Float64("minutes", 15, "how long the load and the faults run (with --ramp-step: at most)")
	every := fs.Duration("fault-every", soak.DefaultFaultEvery, "time between two random faults")
	memEvery := fs.Duration("memory-every", soak.DefaultMemoryEvery, "time between two memory samples")
	rate := fs.Float64("rate", soak.DefaultRate, "new starts per second over all tenants (the first step's with --ramp-step)")
	rampStep := fs.Float64("ramp-step", 0, "raise the rate by this much every --ramp-every until a step fails (0: a steady rate)")
	rampEvery := fs.Duration("ramp-every", time.Minute, "length of a ramp step")
	waitBound := fs.Duration("wait-bound", soak.DefaultWaitBound, "a ramp step fails when its p95 claim wait passes this")
	workers := fs.Int("workers", 2, "worker processes per shard")
	slots := fs.Int("slots", soak.DefaultSlots, "tasks each worker runs at once")
	maxRuns := fs.Int("max-runs", 0, "the system limit, HARVEST_MAX_RUNS (0: twelve seconds of starts, at least 1,000; none with --ramp-step)")
	seed := fs.Uint64("seed", 0, "seed of the fault choice (0: from the clock)")
	role := fs.String("role", "", "internal: run as the fleet's gateway or worker process")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch *role {
	case "":
	case "gateway":
		os.Exit(gateway.Main(nil, e.stdout, e.stderr))
	case "worker":
		os.Exit(workerbin.Main(nil, e.stdout, e.stderr))
	default:
		return usageError{Msg: fmt.Sprintf("--role: %q is not gateway or worker", *role)}
	}
	switch {
	case *minutes <= 0:
		return usageError{Msg: "--minutes: must be positive"}
	case *rate <= 0:
		return usageError{Msg: "--rate: must be positive"}
	case *rampStep < 0:
		return usageError{Msg: "--ramp-step: must not be negative"}
	case *workers < 1 || *slots < 1:
		return usageError{Msg: "--workers and --slots: must be positive"}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	server := os.Getenv("HARVEST_DATABASE_URL")
	if server == "" {
		server = defaultBenchURL
	}
	return soak.Run(ctx, soak.SoakOptions{
		Bins:            soakBinaries(self),
		ServerURL:       server,
		Duration:        time.Duration(*minutes * float64(time.Minute)),
		FaultEvery:      *every,
		MemoryEvery:     *memEvery,
		Rate:            *rate,
		RampStep:        *rampStep,
		RampEvery:       *rampEvery,
		WaitBound:       *waitBound,
		WorkersPerShard: *workers,
		Slots:           *slots,
		MaxRuns:         *maxRuns,
		Seed:            *seed,
		Out:             e.stdout,
	})
}

// soakBinaries are the soak fleet's gateway and worker: this program
// again, in a role.
func soakBinaries(self string) soak.Binaries {
	return soak.Binaries{
		Gateway: soak.Command{Path: self, Args: []string{"soak", "--role", "gateway"}},
		Worker:  soak.Command{Path: self, Args: []string{"soak", "--role", "worker"}},
	}
}
