package main

import (
	"context"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/neighbour"
)

func runBenchNeighbour(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "neighbour",
		"neighbour [--heavy 1] [--light 2] [--runs 3000] [--ms 200] [--batch 500] [--priority 1000] [--fallback-priority 0] [--every 100ms] [--for 0] [--baseline | --raise] [--quiet]\n\n"+
			"Against the gateway of the file harvest dev --env-file writes (source it first): tenant --heavy floods\n"+
			"--queue with sleep runs at --priority (sent again at --fallback-priority and 10 below it when refused),\n"+
			"while tenant --light starts a plain run every --every; prints the light runs' waits from start to claim.")
	heavyN := fs.Int("heavy", 1, "N of the flooding tenant (HARVEST_TENANT_<N>_*)")
	lightN := fs.Int("light", 2, "N of the tenant starting plain runs")
	runs := fs.Int("runs", 3000, "runs of the flood")
	ms := fs.Int("ms", 200, "how long each run of the flood sleeps, in milliseconds")
	batch := fs.Int("batch", 500, "starts per batch start of the flood")
	prio := fs.Int("priority", 1000, "priority of the flood")
	fallback := fs.Int("fallback-priority", 0, "when the flood is refused, it is sent again with half its runs at this priority and half 10 below")
	queue := fs.String("queue", "default", "queue of every run")
	every := fs.Duration("every", 100*time.Millisecond, "the light tenant's pace: one plain run per interval")
	dur := fs.Duration("for", 0, "how long the light tenant keeps its pace (0: until the flood drains)")
	maxWait := fs.Duration("max-wait", 5*time.Minute, "give up when the flood has not drained by then")
	baseline := fs.Bool("baseline", false, "flood at priority 0 only (an ordinary flood, for comparison)")
	raise := fs.Bool("raise", false, "have HARVEST_ADMIN_TOKEN raise the heavy tenant's priority ceiling to --priority for the run (cleared afterwards)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *heavyN == *lightN:
		return usageError{Msg: "--heavy and --light must differ"}
	case *runs < 1:
		return usageError{Msg: "--runs: must be at least 1"}
	case *ms < 0 || *ms > workerbin.DemoMaxMS:
		return usageError{Msg: "--ms: must be from 0 to ten minutes"}
	case *batch < 1 || *batch > api.MaxBatchItems:
		return usageError{Msg: "--batch: must be from 1 to 1000"}
	case *prio < -1000 || *prio > 1000:
		return usageError{Msg: "--priority: must be from -1000 to 1000"}
	case *fallback-neighbour.FallbackStep < -1000 || *fallback > 1000:
		return usageError{Msg: "--fallback-priority: must be from -990 to 1000"}
	case *every <= 0 || *dur < 0 || *maxWait <= 0:
		return usageError{Msg: "--every and --max-wait must be positive, --for not negative"}
	case *baseline && *raise:
		return usageError{Msg: "--baseline and --raise do not go together"}
	}
	cfg := neighbour.Config{Queue: *queue, Runs: *runs, MS: *ms, Batch: *batch, Priority: *prio, FallbackPriority: *fallback,
		Every: *every, For: *dur, MaxWait: *maxWait, Baseline: *baseline, Raise: *raise,
		Command: strings.Join(append([]string{"harvest-bench neighbour"}, args...), " "), Out: e.stdout, Log: e.stderr}
	var err error
	if cfg.Heavy, err = neighbour.TenantFromEnv(*heavyN); err != nil {
		return usageError{Msg: err.Error()}
	}
	if cfg.Light, err = neighbour.TenantFromEnv(*lightN); err != nil {
		return usageError{Msg: err.Error()}
	}
	if *raise {
		var admin *client.Client
		if admin, err = neighbour.AdminFromEnv(); err != nil {
			return usageError{Msg: err.Error()}
		}
		cfg.Admin = admin
	}
	if *quiet {
		cfg.Log = nil
	}
	_, err = neighbour.Run(ctx, cfg)
	return err
}
