package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/harvest-run/harvest/tools/internal/startbench"
)

// runBenchSustain is harvest-bench sustain: single starts offered at a
// rising rate over HTTP and over NATS to a fleet of processes, the
// highest rate that holds, River beside it (--vs-river); or, with
// --overload, several times a given capacity with a gateway killed on
// the way.
func runBenchSustain(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "sustain",
		"sustain [--transports http,nats] [--rates 500,1000,...] [--step 10s] [--senders 128] [--tenants 3] [--shards 2] [--keep-going] [--vs-river] "+
			"| --overload --capacity N [--factor 3] [--duration 30s] [--kill-at 10s] [--drain 3m] [--gateways 2]")
	transports := fs.String("transports", "http,nats", "transports to measure, in order (comma-separated: http, nats), each on a fleet of its own")
	rates := fs.String("rates", "500,1000,1500,2000,2500,3000,4000,5000", "offered starts per second of the steps, rising")
	step := fs.Duration("step", 10*time.Second, "how long each rate is offered")
	senders := fs.Int("senders", 128, "concurrent senders of the steps")
	tenants := fs.Int("tenants", 3, "tenants the starts are spread over")
	shards := fs.Int("shards", 2, "shard databases, each with one worker process")
	gateways := fs.Int("gateways", 0, "gateway processes (default 1; 2 with --overload, one of which is killed)")
	keepGoing := fs.Bool("keep-going", false, "measure every rate instead of stopping at the first that fails")
	vsRiver := fs.Bool("vs-river", false, "drive River (bench/river, river-bench sustain) the same way after Harvest: one Insert per job")
	riverSlots := fs.Int("river-slots", 100, "River's MaxWorkers")
	riverCooldown := fs.Duration("river-cooldown", time.Millisecond, "River's FetchCooldown (its smallest is 1ms)")
	riverPool := fs.Int("river-pool", 40, "River's pgx pool (its inserts and its client share it)")
	overload := fs.Bool("overload", false, "offer --factor times --capacity instead, kill a gateway on the way, and report goodput, refusals and readiness")
	capacity := fs.Int("capacity", 0, "with --overload: the starts per second the fleet holds")
	factor := fs.Float64("factor", 3, "with --overload: how many times --capacity is offered")
	duration := fs.Duration("duration", 30*time.Second, "with --overload: how long the overload lasts")
	killAt := fs.Duration("kill-at", 0, "with --overload: when gateway 0 is killed and started again (default: a third of --duration; negative: never)")
	drain := fs.Duration("drain", 3*time.Minute, "with --overload: how long to wait afterwards for every acknowledged start to be claimed")
	outDir := fs.String("out-dir", filepath.Join(os.TempDir(), "harvest-sustain"), "directory for the built binaries")
	workerBin := fs.String("worker-bin", "", "worker binary (default: built from this source tree)")
	gatewayBin := fs.String("gateway-bin", "", "gateway binary (default: built from this source tree)")
	riverBin := fs.String("river-bin", "", "river-bench binary (default: built from bench/river)")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var trs []string
	for _, t := range strings.Split(*transports, ",") {
		switch t = strings.TrimSpace(t); t {
		case "http", "nats":
			trs = append(trs, t)
		default:
			return usageError{Msg: "--transports: unknown transport " + t + " (http, nats)"}
		}
	}
	var rs []int
	for _, s := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || (len(rs) > 0 && n <= rs[len(rs)-1]) {
			return usageError{Msg: "--rates: want rising whole numbers above 0, such as 500,1000,2000"}
		}
		rs = append(rs, n)
	}
	switch {
	case *senders < 1 || *tenants < 1 || *shards < 1 || *gateways < 0:
		return usageError{Msg: "--senders, --tenants and --shards must be at least 1"}
	case *step <= 0 || *duration <= 0 || *drain <= 0:
		return usageError{Msg: "--step, --duration and --drain must be positive"}
	case *overload && *capacity < 1:
		return usageError{Msg: "--overload needs --capacity (starts per second the fleet holds)"}
	case *overload && *vsRiver:
		return usageError{Msg: "--vs-river goes with the rising rates, not --overload"}
	case *factor <= 0:
		return usageError{Msg: "--factor must be positive"}
	}
	log := e.stderr
	if *quiet {
		log = nil
	}
	serverURL := os.Getenv("HARVEST_DATABASE_URL")
	if serverURL == "" {
		serverURL = defaultBenchURL
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	bin, err := filepath.Abs(filepath.Join(*outDir, "bin"))
	if err != nil {
		return err
	}
	build := func(what, dst string, args ...string) (string, error) {
		fmt.Fprintf(e.stderr, "sustain: building %s\n", what)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Stdout, cmd.Stderr = e.stderr, e.stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("build %s: %w", what, err)
		}
		return dst, nil
	}
	root, rootErr := moduleRoot()
	need := func(flag string) error {
		if rootErr != nil {
			return fmt.Errorf("sustain: %w (or pass %s)", rootErr, flag)
		}
		return nil
	}
	fc := startbench.FleetConfig{ServerURL: serverURL, Shards: *shards, Gateways: *gateways, Tenants: *tenants,
		GatewayBin: *gatewayBin, WorkerBin: *workerBin}
	if fc.WorkerBin == "" {
		if err := need("--worker-bin"); err != nil {
			return err
		}
		dst := filepath.Join(bin, "worker")
		if fc.WorkerBin, err = build("the worker", dst, "-C", root, "build", "-o", dst, "./cmd/worker"); err != nil {
			return err
		}
	}
	if fc.GatewayBin == "" {
		if err := need("--gateway-bin"); err != nil {
			return err
		}
		dst := filepath.Join(bin, "gateway")
		if fc.GatewayBin, err = build("the gateway", dst, "-C", root, "build", "-o", dst, "./cmd/gateway"); err != nil {
			return err
		}
	}
	if *overload {
		_, err := startbench.RunOverload(ctx, startbench.OverloadConfig{Fleet: fc, Transports: trs, Capacity: *capacity,
			Factor: *factor, Duration: *duration, KillAt: *killAt, Drain: *drain, Out: e.stdout, Log: log})
		return err
	}
	cfg := startbench.SustainConfig{Fleet: fc, Transports: trs, Rates: rs, Step: *step, Senders: *senders,
		KeepGoing: *keepGoing, Out: e.stdout, Log: log}
	if *vsRiver {
		rc := &startbench.RiverConfig{Bin: *riverBin, Slots: *riverSlots, FetchCooldown: *riverCooldown, PoolSize: *riverPool}
		if rc.Bin == "" {
			if err := need("--river-bin"); err != nil {
				return err
			}
			dst := filepath.Join(bin, "river-bench")
			if rc.Bin, err = build("river-bench", dst, "-C", filepath.Join(root, "bench", "river"), "build", "-o", dst, "."); err != nil {
				return err
			}
		}
		cfg.River = rc
	}
	_, err = startbench.RunSustain(ctx, cfg)
	return err
}
