package workerbin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

// Usage writes the help text: what the worker does and every variable it
// reads, with its default.
func Usage(w io.Writer) { binary.Usage(w, &Config{}) }

// binary is how the worker presents itself on the command line.
var binary = config.Binary{Name: "worker", Intro: `worker: claims and runs the tasks of one Harvest shard.

It serves the queues in HARVEST_WORKER_QUEUES on shard HARVEST_WORKER_SHARD
and asks services over NATS (harvest.handle.<workflow>) to run each task.
With HARVEST_WORKER_DEMO_HANDLERS=true it also runs the demo workflows echo,
sleep, fail and steps itself (for demos and tests). SIGTERM or SIGINT stops
it gracefully. OTEL_* variables configure trace export.
`}

// Main runs the worker with the process arguments (without the program
// name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	var cfg Config
	if code, ok := binary.Start(args, stdout, stderr, &cfg); !ok {
		return code
	}
	if cfg.ID == "" {
		cfg.ID = worker.DefaultID()
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	defer startProfile(stderr)()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("worker failed", "err", err)
		return config.ExitError
	}
	return config.ExitOK
}

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	shutdownTelemetry, err := telemetry.Setup(ctx, "harvest-worker")
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTelemetry(sctx)
	}()

	pool, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	warnAutovacuumOff(ctx, log, pool, cfg.Shard)
	warnConnectionLimit(ctx, log, pool, cfg.Shard)

	// running is set once the worker loop starts, so that /readyz does not
	// send traffic-dependent checks to a worker still wiring itself up.
	var running atomic.Bool
	// natsConn is set once NATS is dialled; /readyz reports its state.
	var natsConn atomic.Pointer[nats.Conn]
	if cfg.MetricsAddr != "" {
		srv, _, err := serveMetrics(cfg.MetricsAddr, log, pool, &running, &natsConn)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	nc, err := natsconn.Connect(cfg.NATSURL, natsconn.Options{
		Name: "harvest-worker " + cfg.ID, Logger: log, Meanwhile: "polling",
	})
	if err != nil {
		return fmt.Errorf("HARVEST_NATS_URL: %w", err)
	}
	defer nc.Close()
	natsConn.Store(nc)
	defer telemetry.RegisterNATS(nc)()
	defer telemetry.RegisterPool(cfg.Shard, pool)()

	w, err := newWorker(pool, cfg, workerOptions(nc, cfg, log), log)
	if err != nil {
		return err
	}
	unregister, err := worker.BacklogMetrics(pool, cfg.Shard, cfg.Worker().QueueNames())
	if err != nil {
		return err
	}
	defer func() { _ = unregister() }()
	running.Store(true)
	defer running.Store(false)
	return w.Run(ctx)
}

// workerOptions are the worker's collaborators: NATS, and the bridge that
// asks a service over NATS to run a workflow the worker has no handler for.
func workerOptions(nc *nats.Conn, cfg Config, log *slog.Logger) worker.Options {
	subj := dispatch.Subjects{}
	return worker.Options{
		NATS: nc, Subjects: subj, Logger: log,
		Fallback: Bridge{NC: nc, Subjects: subj, Timeout: cfg.HandleTimeout},
	}
}

// newWorker makes the worker the binary runs. The demo workflows are
// registered only when HARVEST_WORKER_DEMO_HANDLERS asks for them: they
// run for any tenant that starts them, so a production worker must not
// carry them unasked.
func newWorker(pool *pgxpool.Pool, cfg Config, opts worker.Options, log *slog.Logger) (*worker.Worker, error) {
	w, err := worker.New(pool, cfg.Worker(), opts)
	if err != nil {
		return nil, err
	}
	if cfg.DemoHandlers {
		log.Warn("demo workflows on (HARVEST_WORKER_DEMO_HANDLERS=true): any tenant may run echo, sleep, fail and steps on this worker's queues; keep it off outside demos and tests",
			"workflows", DemoWorkflows)
		RegisterDemo(w)
	}
	return w, nil
}

// connect opens the pool of the served shard and applies the schema
// migrations it lacks (under the migrations' advisory lock).
func connect(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	url := cfg.Shards[cfg.Shard]
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("HARVEST_SHARDS: shard %d: %w", cfg.Shard, err)
	}
	telemetry.PoolConfig(pcfg)
	// A worker stopped in the middle of a transaction (SIGSTOP, a VM
	// paused, a long GC) would keep that transaction's locks for as long
	// as it stays stopped, and every other worker's rescue of its tasks
	// would queue behind them. Past its lease such a worker has lost its
	// tasks anyway: let the server end its open transaction then too.
	if _, set := pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] =
			strconv.FormatInt(max(cfg.Lease, time.Second).Milliseconds(), 10)
	}
	// One claim loop per task slot needs a connection per loop, plus the
	// outcome flusher, the heartbeat loop, the janitor and some slack. In
	// batch mode the slots share a few claim statements; every outcome and
	// every heartbeat of the worker goes in one statement per batch.
	conns := 2*cfg.MaxConcurrentClaims + 2
	if cfg.ClaimBatch > 1 {
		conns = min(conns, 2*cfg.BatchClaimers+16)
	}
	pcfg.MaxConns = max(pcfg.MaxConns, int32(conns))
	// pgpool: the pool follows a change of the shard's primary.
	pool, err := pgpool.New(ctx, cfg.Shard, pgpool.AppWorker, pcfg)
	if err != nil {
		return nil, fmt.Errorf("shard %d (%s): %w", cfg.Shard, config.Redact(url), err)
	}
	// A shard that is still starting (a fleet booting together) refuses
	// connections for a while: keep trying, with backoff, for a minute.
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		_, err := schema.Migrate(mctx, pool)
		if err == nil {
			return pool, nil
		}
		if mctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("shard %d (%s): migrate: %w", cfg.Shard, config.Redact(url), err)
		}
		slog.Warn("shard not ready: retrying", "shard", cfg.Shard, "url", config.Redact(url), "err", err, "wait", wait)
		select {
		case <-mctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// warnAutovacuumOff logs a warning when the shard's server runs without
// autovacuum: every run and task is updated several times, and only the
// fair claim's small tables are vacuumed by the janitor, so runs and tasks
// would grow with dead rows until someone vacuums them. (The janitor
// analyzes tables whose statistics fell behind, which keeps plans sound,
// but frees no dead row.)
func warnAutovacuumOff(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, shard int) {
	var on bool
	if err := pool.QueryRow(ctx, sqlAutovacuumOn).Scan(&on); err == nil && !on {
		log.Warn("autovacuum is off on this shard's server: runs and tasks will grow with dead rows; turn it on, or vacuum them on a schedule",
			"shard", shard)
	}
}

// warnConnectionLimit warns when the worker's pool may open more
// connections than the shard's server accepts at all: one claim loop per
// slot (HARVEST_WORKER_CLAIM_BATCH=1) opens up to two connections a slot,
// and at the default 100 slots that is past a default server's 100. Such a
// worker runs until its loops all claim at once, and then its claims,
// outcomes and heartbeats fail with "too many clients" (leases lost, tasks
// run again). The server's limit is not known when the configuration is
// read, so this is a warning at start, not a configuration error.
func warnConnectionLimit(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, shard int) {
	var accepts int
	if err := pool.QueryRow(ctx, sqlConnectionLimit).Scan(&accepts); err != nil {
		return
	}
	if opens := int(pool.Config().MaxConns); opens > accepts {
		log.Warn("this worker may open more connections than the shard's server accepts: lower HARVEST_WORKER_MAX_CONCURRENT_CLAIMS, claim in batches (HARVEST_WORKER_CLAIM_BATCH above 1, the default), or raise the server's max_connections",
			"shard", shard, "pool_max_conns", opens, "server_accepts", accepts)
	}
}

// serveMetrics serves /metrics, /healthz (the process answers) and /readyz
// (the shard answers within a second and takes writes, see pgpool.Ping,
// and the worker loop runs) on addr, and returns the address it listens on
// (addr may name port 0). The probes are cheap so that orchestrators may
// poll them often.
func serveMetrics(addr string, log *slog.Logger, pool *pgxpool.Pool, running *atomic.Bool, natsConn *atomic.Pointer[nats.Conn]) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("HARVEST_WORKER_METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", telemetry.MetricsHandler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !running.Load() {
			http.Error(w, "worker loop not running", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := pgpool.Ping(ctx, pool); err != nil {
			http.Error(w, "shard: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		// Without NATS the worker still claims (by polling), but hears no
		// wake-ups and cannot reach handler services: not ready, like a
		// gateway, until the connection is back on some node.
		if nc := natsConn.Load(); nc != nil && !nc.IsConnected() {
			http.Error(w, "nats: "+nc.Status().String()+" (claiming by polling meanwhile)", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return srv, ln.Addr().String(), nil
}
