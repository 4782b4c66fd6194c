package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/harvest-run/harvest/tools/internal/startbench"
)

func runBenchStarts(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "starts",
		"starts [--transports http,nats] [--clients 8] [--duration 10s] [--warmup 2s] [--keys 1] [--tenants 1] [--flushers N] [--group-max N] [--cpuprofile FILE] [--quiet]")
	transports := fs.String("transports", "http,nats", "transports to measure, in order (comma-separated: http, nats)")
	clients := fs.Int("clients", 8, "concurrent clients, each starting runs in a closed loop")
	duration := fs.Duration("duration", 10*time.Second, "measured time per transport")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured time before each measurement")
	keys := fs.Int("keys", 1, "fairness keys the starts are spread over")
	tenants := fs.Int("tenants", 1, "tenants the clients are spread over (client i is tenant i mod N)")
	flushers := fs.Int("flushers", 0, "start groups in flight per shard (0: the gateway's default, HARVEST_GATEWAY_GROUP_FLUSHERS)")
	groupMax := fs.Int("group-max", 0, "most starts per transaction (0: the gateway's default, HARVEST_GATEWAY_GROUP_MAX; 1: a commit per start)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (clients and gateway) to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *clients < 1 {
		return usageError{Msg: "--clients: must be at least 1"}
	}
	if *tenants < 1 {
		return usageError{Msg: "--tenants: must be at least 1"}
	}
	if *flushers < 0 {
		return usageError{Msg: "--flushers: must not be negative"}
	}
	if *groupMax < 0 || *groupMax > 60 {
		return usageError{Msg: "--group-max: must be from 0 to 60"}
	}
	if *duration <= 0 {
		return usageError{Msg: "--duration: must be positive"}
	}
	cfg := startbench.Config{
		Clients: *clients, Duration: *duration, Warmup: *warmup, Keys: *keys, Tenants: *tenants, Flushers: *flushers, GroupMax: *groupMax,
		NATSURL: os.Getenv("HARVEST_NATS_URL"), Out: e.stdout, Log: e.stderr,
	}
	for _, t := range strings.Split(*transports, ",") {
		switch t = strings.TrimSpace(t); t {
		case "http", "nats":
			cfg.Transports = append(cfg.Transports, t)
		default:
			return usageError{Msg: "--transports: unknown transport " + t + " (http, nats)"}
		}
	}
	if *quiet {
		cfg.Log = nil
	}
	cfg.ServerURL = os.Getenv("HARVEST_DATABASE_URL")
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	_, err = startbench.Run(ctx, cfg)
	return err
}
