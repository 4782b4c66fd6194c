package main

import (
	"context"
	"os"
	"time"

	"github.com/harvest-run/harvest/tools/internal/fairbench"
)

func runBenchFairness(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "fairness",
		"fairness [-scenario keys,runtime] [-workers 2] [-slots 50] [-warmup 10s] [-window 40s] [-chart docs/images/fairness-modes.svg]")
	scenario := fs.String("scenario", "both", "keys (100 keys against 1, two-level off and on), runtime (2 s against 20 ms tasks, charge claims and runtime) or both")
	workers := fs.Int("workers", 2, "worker loops, each claiming a batch for its free slots")
	slots := fs.Int("slots", 50, "task slots per worker")
	warmup := fs.Duration("warmup", 10*time.Second, "time before the measured window")
	window := fs.Duration("window", 40*time.Second, "the measured window")
	chart := fs.String("chart", "docs/images/fairness-modes.svg", "SVG file to write (empty: none)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *workers < 1 || *slots < 1 || *warmup < 0 || *window <= 0 {
		return usageError{Msg: "-workers, -slots and -window must be positive, -warmup not negative"}
	}
	var scs []fairbench.Scenario
	for _, s := range fairbench.Scenarios() {
		if *scenario == "both" || *scenario == s.Name {
			scs = append(scs, s)
		}
	}
	if len(scs) == 0 {
		return usageError{Msg: "-scenario: keys, runtime or both"}
	}
	cfg := fairbench.Config{Scenarios: scs, Workers: *workers, Slots: *slots, Warmup: *warmup, Window: *window,
		Out: e.stdout, Log: e.stderr}
	if *quiet {
		cfg.Log = nil
	}
	cfg.ServerURL = os.Getenv("HARVEST_DATABASE_URL")
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	rs, err := fairbench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *chart != "" {
		return fairbench.WriteChart(*chart, scs, rs)
	}
	return nil
}
