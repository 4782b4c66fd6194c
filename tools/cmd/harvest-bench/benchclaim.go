package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/harvest-run/harvest/tools/internal/bench"
)

// defaultBenchURL is the server benchmarks use when HARVEST_DATABASE_URL is
// not set (the same variable `harvest dev` reads).
const defaultBenchURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func runBench(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] != "claim" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stderr, "usage: harvest-bench claim [flags]")
			return nil
		}
		return usageError{Msg: "usage: harvest-bench claim [flags] (the only benchmark is claim)"}
	}
	return runBenchClaim(ctx, e, args[1:])
}

func runBenchClaim(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "claim",
		"claim [--backlog 10000,100000] [--keys 10,1000] [--claimers 1,4,16] [--claims 2000] [--rounds 4] [--aging 0] [--quiet]")
	backlog := fs.String("backlog", "100000", "pending rows (comma-separated list: one fresh database per point)")
	keys := fs.String("keys", "1000", "light fairness keys besides the heavy one (comma-separated list)")
	claimers := fs.String("claimers", "1,4,16", "concurrent claim loops (comma-separated list)")
	claims := fs.Int("claims", 2000, "measured claims per mode and claimer count")
	rounds := fs.Int("rounds", 4, "turns the fair and ordinary claims take at each point (the claims are split over them)")
	heavy := fs.Float64("heavy", 0.9, "share of the backlog held by the heavy key")
	aging := fs.Int("aging", 0, "priority ageing period in seconds for both claims (0: off)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *aging < 0 {
		return usageError{Msg: "--aging: must not be negative"}
	}
	if *rounds < 1 {
		return usageError{Msg: "--rounds: must be at least 1"}
	}
	cfg := bench.ClaimConfig{Claims: *claims, Rounds: *rounds, HeavyPct: *heavy, AgingSecs: *aging, Out: e.stdout, Log: e.stderr}
	var err error
	if cfg.Backlogs, err = intList("backlog", *backlog); err != nil {
		return err
	}
	if cfg.Keys, err = intList("keys", *keys); err != nil {
		return err
	}
	if cfg.Claimers, err = intList("claimers", *claimers); err != nil {
		return err
	}
	if *claims < 1 {
		return usageError{Msg: "--claims: must be at least 1"}
	}
	if *quiet {
		cfg.Log = nil
	}
	cfg.ServerURL = os.Getenv("HARVEST_DATABASE_URL")
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	_, err = bench.RunClaim(ctx, cfg)
	return err
}

func intList(flag, s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 {
			return nil, usageError{Msg: fmt.Sprintf("--%s: %q is not a positive integer", flag, part)}
		}
		out = append(out, n)
	}
	return out, nil
}
