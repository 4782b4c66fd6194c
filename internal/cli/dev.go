package cli

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/devfleet"
)

// devEnv is what `harvest dev` reads from the environment.
type devEnv struct {
	DatabaseURL string `envconfig:"DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" desc:"harvest dev: admin URL of the PostgreSQL server to make the shard databases on; a throwaway server is started when none answers"`
}

const devUsage = `dev [--shards N] [--queues a,b:3] [--http ADDR] [--nats-port N] [--max-runs N] [--env-file PATH] [--trace-stdout] [--verbose]

Runs a whole Harvest on this machine, in this process, until Ctrl-C:
embedded NATS (with the per-tenant permissions of deploy/), --shards shard
databases (default 2) on the PostgreSQL server at HARVEST_DATABASE_URL (or
on a throwaway server when none answers), one gateway and one worker per
shard with fairness keys on, serving the queues of --queues. Prints the
URLs (the shards' are the HARVEST_SHARDS of harvest tenants and migrate)
and fresh tokens (an administrator and three tenants, with each one's home
shard). A start on a queue the workers do not serve waits; harvest dev
warns about it once per queue. More than 2 --shards are refused when
their connections (a gateway's and a worker's pools per shard) could pass
the server's max_connections. Ctrl-C stops everything and removes what it made.

Flags:`

func runDev(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "dev", devUsage)
	httpAddr := fs.String("http", "", "gateway listen address (default "+devfleet.DefaultHTTPAddr+", or a free port when it is taken)")
	natsPort := fs.Int("nats-port", 0, fmt.Sprintf("embedded NATS client port on 127.0.0.1 (default %d, or a free port when it is taken)", devfleet.DefaultNATSPort))
	nShards := fs.Int("shards", devfleet.DefaultShards, fmt.Sprintf("shard databases to make, 1 to %d, each with a worker", devfleet.MaxShards))
	maxRuns := fs.Int("max-runs", devfleet.DefaultMaxRuns, "system limit of unfinished runs (HARVEST_MAX_RUNS of the gateway)")
	envFile := fs.String("env-file", "", "write the URLs and tokens there as NAME=value lines once the fleet takes starts (removed at exit)")
	traceStdout := fs.Bool("trace-stdout", false, "print every finished span to stdout as JSON (noisy)")
	verbose := fs.Bool("verbose", false, "log the gateway's and workers' lines to stderr")
	queuesFlag := fs.String("queues", devfleet.Queue, "queues the workers serve: name[:share] separated by commas, such as orders,emails:3 (share of the claims, default 1)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	queues, err := devfleet.ParseQueues(*queuesFlag)
	if err != nil {
		return usageError{Msg: err.Error()}
	}
	if *nShards < 1 || *nShards > devfleet.MaxShards {
		return usageError{Msg: fmt.Sprintf("--shards %d: want 1 to %d", *nShards, devfleet.MaxShards)}
	}
	if *maxRuns < 1 {
		return usageError{Msg: "--max-runs must be at least 1"}
	}
	if *natsPort < 0 || *natsPort > 65535 {
		return usageError{Msg: "--nats-port must be a port number"}
	}
	var cfg devEnv
	if err := envconfig.Process("HARVEST", &cfg); err != nil {
		return usageError{Msg: err.Error()}
	}
	// The gateway and workers run in this process: the target of their
	// binaries.
	config.TuneGC()
	if *envFile != "" {
		abs, err := filepath.Abs(*envFile)
		if err != nil {
			return usageError{Msg: err.Error()}
		}
		*envFile = abs
		// A file left by an earlier run must not pass for this one's.
		if err := os.Remove(abs); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("--env-file: %w", err)
		}
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	opts := devfleet.Options{
		DatabaseURL: cfg.DatabaseURL,
		HTTPAddr:    *httpAddr,
		NATSPort:    *natsPort,
		MaxRuns:     *maxRuns,
		Shards:      *nShards,
		Queues:      queues,
		Logger:      slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level})),
	}
	if *traceStdout {
		opts.TraceStdout = e.stdout
	}
	fmt.Fprintln(e.stderr, "harvest dev: starting (Ctrl-C stops it and removes what it made)...")
	var readyErr error
	summary := e
	if *traceStdout {
		// Standard output carries the spans; the summary goes to stderr.
		summary.stdout = e.stderr
	}
	err = devfleet.Run(ctx, opts, func(f *devfleet.Fleet) {
		printFleet(summary, f)
		if *envFile != "" {
			if readyErr = writeEnvFile(*envFile, f.EnvLines()); readyErr != nil {
				fmt.Fprintln(e.stderr, "harvest dev: --env-file:", readyErr)
			}
		}
	})
	if *envFile != "" {
		_ = os.Remove(*envFile)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "harvest dev: stopped; databases, NATS store and tokens removed.")
	return readyErr
}

// writeEnvFile writes lines to path at once: other processes see either
// no file or the whole of it.
func writeEnvFile(path string, lines []string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".harvest-env-*")
	if err != nil {
		return err
	}
	_, werr := tmp.WriteString(strings.Join(lines, "\n") + "\n")
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %v %v", path, werr, cerr)
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func printFleet(e env, f *devfleet.Fleet) {
	w := e.stdout
	fmt.Fprintf(w, `
Harvest dev is up.

  gateway     %s   (admin page: %s/admin, metrics: %s/metrics)
  NATS        %s
  Postgres    %s
  shards      %s
  queues      %s, served by one worker per shard (fairness keys on)
  max runs    %d

  admin token %s
`, f.GatewayURL, f.GatewayURL, f.GatewayURL, f.NATSURL, f.Postgres, strings.Join(f.Shards, "\n              "), devfleet.QueueList(f.Queues), f.MaxRuns, f.AdminToken)
	for i, t := range f.Tenants {
		fmt.Fprintf(w, "  tenant %d    %-8s token %s  NATS user %s password %s  (home shard %d)\n",
			i+1, t.Name, t.Token, t.NATSUser, t.NATSPassword, t.Shard)
	}
	t := f.Tenants[0]
	fmt.Fprintf(w, `
Try:
  curl -s -H 'Authorization: Bearer %s' -d '{"name":"echo","queue":%q,"input":{"hello":"world"}}' %s/v1/runs

Ctrl-C stops everything.
`, t.Token, firstQueue(f.Queues), f.GatewayURL)
}

// firstQueue is the queue the printed example starts on: default when
// served, else the first by name, so that the example works as printed.
func firstQueue(queues map[string]float64) string {
	if _, ok := queues[devfleet.Queue]; ok || len(queues) == 0 {
		return devfleet.Queue
	}
	return slices.Sorted(maps.Keys(queues))[0]
}
