// Command harvest-bench runs Harvest's benchmarks and its soak against a
// fleet built from this source tree: claim, claim-chart, starts, sustain
// (sustained starts and overload, with River beside it), fleet (with River
// beside it), soak and mix. Run it from the tools module:
//
//	go -C tools run ./cmd/harvest-bench fleet --vs-river
//
// It lives in the tools module so that its dependencies (plotting, the
// fleet harness) stay out of the product's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/harvest-run/harvest/internal/cliflag"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitInterrupted is the shell's code for a command ended by SIGINT.
	exitInterrupted = 130
)

// usageError marks a mistake in the command line; it exits with code 2.
type usageError = cliflag.UsageError

// env is what a benchmark gets besides its arguments.
type env struct {
	stdout io.Writer
	stderr io.Writer
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run runs a benchmark with args (without the program name) and returns
// the exit code. Ctrl-C or SIGTERM ends it through its context.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runBenchAny(ctx, env{stdout: stdout, stderr: stderr}, args)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case ctx.Err() != nil:
		// Ctrl-C or SIGTERM: the benchmark has stopped what it started and
		// printed what it saw.
		fmt.Fprintf(stderr, "harvest-bench: interrupted (%v)\n", err)
		return exitInterrupted
	}
	fmt.Fprintf(stderr, "harvest-bench: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// newFlags makes a flag set whose errors become usage errors.
func newFlags(e env, name, usage string) *flag.FlagSet {
	return cliflag.New(e.stderr, "harvest-bench", name, usage)
}

// parseFlags parses args, turning a bad flag into a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error { return cliflag.Parse(fs, args) }
