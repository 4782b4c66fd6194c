package main

import (
	"context"
	"os"
	"time"

	"github.com/harvest-run/harvest/tools/internal/movebench"
)

func runBenchMove(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "move", "move [--runs 10000] [--batch 500] [--clients 4] [--baseline 5s] [--quiet]")
	runs := fs.Int("runs", movebench.DefaultRuns, "unfinished runs of the moved tenant")
	batch := fs.Int("batch", 0, "runs per copy step (0: harvest tenants move's default)")
	clients := fs.Int("clients", movebench.DefaultClients, "closed-loop clients of another tenant flooding the old home")
	baseline := fs.Duration("baseline", movebench.DefaultBaseline, "how long the flood is measured before the move")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *runs < 1:
		return usageError{Msg: "--runs: must be at least 1"}
	case *batch < 0:
		return usageError{Msg: "--batch: must not be negative"}
	case *clients < 1:
		return usageError{Msg: "--clients: must be at least 1"}
	case *baseline < 100*time.Millisecond:
		return usageError{Msg: "--baseline: must be at least 100ms"}
	}
	cfg := movebench.Config{Runs: *runs, Batch: *batch, Clients: *clients, Baseline: *baseline,
		NATSURL: os.Getenv("HARVEST_NATS_URL"), ServerURL: os.Getenv("HARVEST_DATABASE_URL"), Out: e.stdout, Log: e.stderr}
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	if *quiet {
		cfg.Log = nil
	}
	_, err := movebench.Run(ctx, cfg)
	return err
}
