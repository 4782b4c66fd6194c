package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/harvest-run/harvest/internal/cliflag"
	"github.com/harvest-run/harvest/internal/config"
)

// Exit codes shared by every command.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks a mistake in the command line; it exits with code 2.
type usageError = cliflag.UsageError

// exitError carries a specific exit code out of a command.
type codedError struct {
	code int
	err  error
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

// env is what a command gets besides its arguments.
type env struct {
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	summary string
	run     func(ctx context.Context, e env, args []string) error
}

func commands() map[string]command {
	return map[string]command{
		"migrate": {"apply the schema migrations to every shard in HARVEST_SHARDS (migrate status: applied and pending)", runMigrate},
		"prune":   {"delete idle fairness state on every shard in HARVEST_SHARDS (or --preview it)", runPrune},
		"repair":  {"rebuild the fair claim's key heads from the task rows on every shard in HARVEST_SHARDS", runRepair},
		"bench":   {"moved to the tools module: go -C tools run ./cmd/harvest-bench <benchmark> (see docs/benchmarks.md)", runBenchMoved},
		"weights": {"get, set or clear fairness-key weight overrides on every shard", runWeights},
		"quotas":  {"get, set or clear quota-key concurrency caps and rate limits on every shard", runQuotas},
		"queues":  {"pause or resume a queue on every shard: workers stop claiming it, starts still wait in it", runQueues},

		"admission": {"show or set tenant admission (algorithm, TFM) on the shards in HARVEST_SHARDS", runAdmission},
		"tenants":   {"list tenants' home shards, pin a new tenant's home, or move a tenant to another shard online", runTenants},

		"dev":   {"run a whole Harvest on this machine (NATS, N shards (--shards, default 2), gateway, a worker per shard) until Ctrl-C", runDev},
		"start": {"start a run through the gateway at HARVEST_GATEWAY_URL (token HARVEST_TOKEN)", runStart},
		"runs":  {"read, list, cancel or retry runs through the gateway: runs get|list|cancel|retry", runRuns},
		"demo":  {"demo flood|share|priority: a flood beside a trickle, weighted shares, priority before fairness", runDemo},

		"version":     {"print the version of this binary (also --version)", runVersion},
		"healthcheck": {"exit 0 when a URL answers 2xx (container healthchecks)", runHealthcheck},
	}
}

// Main runs the harvest command with args (without the program name) and
// returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	e := env{stdout: stdout, stderr: stderr}
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		// Asked-for help is the command's output, so that it pipes into a
		// pager; only a mistake goes to stderr.
		printUsage(stdout, cmds)
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "harvest: unknown command %q\n\n", args[0])
		printUsage(stderr, cmds)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.run(ctx, e, args[1:])
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	}
	fmt.Fprintf(stderr, "harvest %s: %v\n", args[0], err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

func printUsage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: harvest <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'harvest <command> -h' for a command's flags.")
}

// flagOutput is the output of a command's flag set: stderr, carrying the
// command's stdout along so that parseFlags can send asked-for help there.
type flagOutput struct {
	io.Writer
	stdout io.Writer
}

// newFlags makes a flag set whose errors become usage errors. Its usage
// goes to the flag set's current output (not a fixed writer) so that
// parseFlags can point it at stdout for -h.
func newFlags(e env, name, usage string) *flag.FlagSet {
	fs := cliflag.New(e.stderr, "harvest", name, usage)
	fs.SetOutput(&flagOutput{Writer: e.stderr, stdout: e.stdout})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: harvest %s\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, turning a bad flag into a usage error. -h prints
// the usage on stdout (it is what was asked for) and gives flag.ErrHelp; a
// bad flag prints it on stderr.
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	asked := false
	// The flag package calls Usage both for -h and after a bad flag's
	// message; hold it back until the error says which.
	fs.Usage = func() { asked = true }
	err := cliflag.Parse(fs, args)
	fs.Usage = usage
	if !asked {
		return err
	}
	if errors.Is(err, flag.ErrHelp) {
		if fo, ok := fs.Output().(*flagOutput); ok {
			fs.SetOutput(fo.stdout)
			defer fs.SetOutput(fo)
		}
	}
	usage()
	return err
}

// runBenchMoved says where the benchmarks went: they live in the tools
// module, so that their dependencies stay out of this binary.
func runBenchMoved(context.Context, env, []string) error {
	return usageError{Msg: "the benchmarks moved to the tools module: run go -C tools run ./cmd/harvest-bench <claim|claim-chart|starts|fleet|fairness|move|soak> [flags] from the repository"}
}

// runVersion prints "harvest <version>" on stdout, as --version does.
func runVersion(_ context.Context, e env, args []string) error {
	fs := newFlags(e, "version", "version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "harvest "+config.Version())
	return nil
}
