package main

import (
	"context"
	"os"

	"github.com/harvest-run/harvest/tools/internal/bench"
)

func runBenchClaimChart(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "claim-chart",
		"claim-chart [-backlog 10000,100000,1000000] [-keys 100] [-claims 500] [-scan-claims 20] [-chart docs/claim-backlog.svg]")
	backlog := fs.String("backlog", "10000,100000,1000000", "pending rows (comma-separated list: one fresh database per point)")
	keys := fs.Int("keys", 100, "light fairness keys besides the heavy one")
	claims := fs.Int("claims", 500, "measured fair and ordinary claims per point")
	scan := fs.Int("scan-claims", 20, "measured full-scan claims per point (each sorts the whole backlog)")
	chart := fs.String("chart", "docs/claim-backlog.svg", "SVG file to write (empty: none)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := bench.ChartConfig{Keys: *keys, Claims: *claims, ScanClaims: *scan, Path: *chart, Out: e.stdout, Log: e.stderr}
	var err error
	if cfg.Backlogs, err = intList("backlog", *backlog); err != nil {
		return err
	}
	if *keys < 1 || *claims < 1 || *scan < 1 {
		return usageError{Msg: "-keys, -claims and -scan-claims must be positive"}
	}
	if *quiet {
		cfg.Log = nil
	}
	cfg.ServerURL = os.Getenv("HARVEST_DATABASE_URL")
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	_, err = bench.RunClaimChart(ctx, cfg)
	return err
}
