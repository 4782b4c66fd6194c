package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/harvest-run/harvest/tools/internal/fleetbench"
)

func runBenchFleet(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "fleet",
		"fleet [-flood 100000] [-workers 2] [-slots 50] [-claim-batch 50] [-claimers 1] [-light-rate 1] [-fair on|off|both] [-vs-river] [-river-cooldown 1ms] [-pairs 3] [-out-dir DIR]")
	flood := fs.Int("flood", 100000, "no-op tasks of the heavy key inserted before the workers start")
	workers := fs.Int("workers", 2, "worker processes")
	slots := fs.Int("slots", 50, "task slots per worker (HARVEST_WORKER_MAX_CONCURRENT_CLAIMS); workers x slots is River's -slots")
	lightRate := fs.Float64("light-rate", 1, "light tenant's starts per second, from 1 s into the drain")
	fair := fs.String("fair", "both", "Harvest runs per round: on, off or both (on first)")
	vsRiver := fs.Bool("vs-river", false, "after the first Harvest run of each round, run River (bench/river) as it ships and tuned, and the floor (a bare one-table queue)")
	riverCooldown := fs.Duration("river-cooldown", time.Millisecond, "fetch cooldown of the tuned River run (River's smallest is 1ms)")
	pairs := fs.Int("pairs", 3, "rounds")
	batch := fs.Int("claim-batch", 50, "rows per claim statement (HARVEST_WORKER_CLAIM_BATCH; 1: one claim per task)")
	claimers := fs.Int("claimers", 1, "claim statements in flight per worker (HARVEST_WORKER_BATCH_CLAIMERS)")
	maxDur := fs.Duration("max-duration", 5*time.Minute, "give up on a run whose flood has not drained by then")
	outDir := fs.String("out-dir", filepath.Join(os.TempDir(), "harvest-fleet"), "directory for the built binaries, logs, CPU profiles and per-second series")
	chartDir := fs.String("chart-dir", "docs", "directory the SVG chart goes to (empty: no chart)")
	profile := fs.Bool("profile", false, "write a CPU profile of worker 0 of each Harvest run into -out-dir")
	janitor := fs.Bool("janitor", true, "run the janitor in worker 0 (false: in no worker, to see what its ticks cost)")
	workerBin := fs.String("worker-bin", "", "worker binary (default: built from this source tree into -out-dir)")
	gatewayBin := fs.String("gateway-bin", "", "gateway binary (default: built from this source tree)")
	riverBin := fs.String("river-bin", "", "river-bench binary (default: built from bench/river)")
	natsURL := fs.String("nats-url", "", "NATS server (default: one started inside the benchmark, so nothing else sees its messages)")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := fleetbench.Config{
		Flood: *flood, Workers: *workers, Slots: *slots, LightRate: *lightRate, ClaimBatch: *batch,
		Claimers: *claimers, VsRiver: *vsRiver, RiverCooldown: *riverCooldown, Pairs: *pairs, MaxDuration: *maxDur, OutDir: *outDir,
		ChartDir: *chartDir, Profile: *profile, NoJanitor: !*janitor, NATSURL: *natsURL, Out: e.stdout, Log: e.stderr,
	}
	switch *fair {
	case "on":
		cfg.Fair = []bool{true}
	case "off":
		cfg.Fair = []bool{false}
	case "both":
		cfg.Fair = []bool{true, false}
	default:
		return usageError{Msg: "-fair: on, off or both"}
	}
	if *flood < 1 || *workers < 1 || *slots < 1 || *pairs < 1 || *lightRate <= 0 || *batch < 1 || *claimers < 1 || *maxDur <= 0 {
		return usageError{Msg: "-flood, -workers, -slots, -pairs, -claim-batch, -claimers, -light-rate and -max-duration must be positive"}
	}
	if *quiet {
		cfg.Log = nil
	}
	cfg.ServerURL = os.Getenv("HARVEST_DATABASE_URL")
	if cfg.ServerURL == "" {
		cfg.ServerURL = defaultBenchURL
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	bin, err := filepath.Abs(filepath.Join(*outDir, "bin"))
	if err != nil {
		return err
	}
	build := func(what, dst string, args ...string) (string, error) {
		fmt.Fprintf(e.stderr, "fleet: building %s\n", what)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Stdout, cmd.Stderr = e.stderr, e.stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("build %s: %w", what, err)
		}
		return dst, nil
	}
	root, err := moduleRoot()
	if err != nil && (*workerBin == "" || *gatewayBin == "" || (*vsRiver && *riverBin == "")) {
		return fmt.Errorf("fleet: %w (or pass -worker-bin, -gateway-bin and -river-bin)", err)
	}
	if cfg.WorkerBin = *workerBin; cfg.WorkerBin == "" {
		dst := filepath.Join(bin, "worker")
		if cfg.WorkerBin, err = build("the worker", dst, "-C", root, "build", "-o", dst, "./cmd/worker"); err != nil {
			return err
		}
	}
	if cfg.GatewayBin = *gatewayBin; cfg.GatewayBin == "" {
		dst := filepath.Join(bin, "gateway")
		if cfg.GatewayBin, err = build("the gateway", dst, "-C", root, "build", "-o", dst, "./cmd/gateway"); err != nil {
			return err
		}
	}
	if cfg.RiverBin = *riverBin; cfg.RiverBin == "" && *vsRiver {
		dst := filepath.Join(bin, "river-bench")
		if cfg.RiverBin, err = build("river-bench", dst, "-C", filepath.Join(root, "bench", "river"), "build", "-o", dst, "."); err != nil {
			return err
		}
	}
	_, _, err = fleetbench.Run(ctx, cfg)
	return err
}

// moduleRoot finds the directory of Harvest's go.mod above the working
// directory (the benchmark builds the real binaries from source).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/harvest-run/harvest\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside Harvest's source tree")
		}
		dir = parent
	}
}
