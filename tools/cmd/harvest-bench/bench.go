package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// benchmarks are the subcommands of harvest-bench.
func benchmarks() map[string]func(ctx context.Context, e env, args []string) error {
	return map[string]func(ctx context.Context, e env, args []string) error{
		"claim": func(ctx context.Context, e env, args []string) error {
			return runBench(ctx, e, append([]string{"claim"}, args...))
		},
		"starts":      runBenchStarts,
		"sustain":     runBenchSustain,
		"fleet":       runBenchFleet,
		"claim-chart": runBenchClaimChart,
		"soak":        runBenchSoak,
		"move":        runBenchMove,
		"fairness":    runBenchFairness,
		"mix":         runBenchMix,
		"neighbour":   runBenchNeighbour,
	}
}

// runBenchAny dispatches harvest-bench <name> to its benchmark.
func runBenchAny(ctx context.Context, e env, args []string) error {
	all := benchmarks()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	usage := "usage: harvest-bench <" + strings.Join(names, "|") + "> [flags]"
	if len(args) == 0 {
		return usageError{Msg: usage}
	}
	if args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(e.stderr, usage)
		return nil
	}
	run, ok := all[args[0]]
	if !ok {
		return usageError{Msg: fmt.Sprintf("unknown benchmark %q; %s", args[0], usage)}
	}
	return run(ctx, e, args[1:])
}
