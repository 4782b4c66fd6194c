package main

import (
	"context"
	"os"
	"time"

	"github.com/harvest-run/harvest/tools/internal/soak"
)

// runBenchMix is harvest-bench mix: the soak's mixed load without faults,
// on a fleet of gateway and worker processes (this binary again, in the
// soak's roles) that run on their shipped defaults, ramped until a step
// fails; per step the rates, claim waits and backlog, and per run the
// database's CPU, WAL, commits and statements.
func runBenchMix(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "mix", "mix [--rate 100] [--ramp-step 100] [--ramp-every 45s] [--minutes 6] [--wait-bound 5s] [--workers 2] [--max-runs N] [--cpuprofile FILE]")
	minutes := fs.Float64("minutes", soak.DefaultMixDuration.Minutes(), "longest the ramp runs: as many whole steps as fit")
	rate := fs.Float64("rate", soak.DefaultMixRate, "the first step's new starts per second over all tenants")
	rampStep := fs.Float64("ramp-step", soak.DefaultMixRampStep, "what each step adds to the rate (0: every step at --rate)")
	rampEvery := fs.Duration("ramp-every", soak.DefaultMixRampEvery, "length of a step")
	waitBound := fs.Duration("wait-bound", soak.DefaultWaitBound, "a step fails when its p95 claim wait passes this")
	workers := fs.Int("workers", 2, "worker processes per shard")
	maxRuns := fs.Int("max-runs", 1_000_000, "the gateways' system limit, HARVEST_MAX_RUNS (the shipped 128 would stop the ramp)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the harness (load, proxies, monitor; not the fleet's processes) to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *minutes <= 0:
		return usageError{Msg: "--minutes: must be positive"}
	case *rate <= 0:
		return usageError{Msg: "--rate: must be positive"}
	case *rampStep < 0:
		return usageError{Msg: "--ramp-step: must not be negative"}
	case *rampEvery <= 0:
		return usageError{Msg: "--ramp-every: must be positive"}
	case time.Duration(*minutes*float64(time.Minute)) < *rampEvery:
		return usageError{Msg: "--minutes: shorter than one step (--ramp-every)"}
	case *waitBound <= 0:
		return usageError{Msg: "--wait-bound: must be positive"}
	case *workers < 1:
		return usageError{Msg: "--workers: must be positive"}
	case *maxRuns < 1:
		return usageError{Msg: "--max-runs: must be positive"}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	server := os.Getenv("HARVEST_DATABASE_URL")
	if server == "" {
		server = defaultBenchURL
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	return soak.RunMix(ctx, soak.MixOptions{
		Bins:            soakBinaries(self),
		ServerURL:       server,
		Duration:        time.Duration(*minutes * float64(time.Minute)),
		Rate:            *rate,
		RampStep:        *rampStep,
		RampEvery:       *rampEvery,
		WaitBound:       *waitBound,
		WorkersPerShard: *workers,
		MaxRuns:         *maxRuns,
		Out:             e.stdout,
	})
}
