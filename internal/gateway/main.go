package gateway

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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Usage writes the help text: what the gateway does and every variable it
// reads, with its default.
func Usage(w io.Writer) { binary.Usage(w, &Config{}) }

// binary is how the gateway presents itself on the command line.
var binary = config.Binary{Name: "gateway", Intro: `gateway: the HTTP API and NATS start service of Harvest.

It starts, reads, lists and cancels runs over HTTP (HARVEST_GATEWAY_ADDR,
bearer tokens from HARVEST_GATEWAY_TOKENS_FILE, reloaded on change or SIGHUP)
and takes starts over NATS on <prefix>.start.<tenant> and
<prefix>.start_batch.<tenant>. Each tenant's runs live on its home shard among
HARVEST_SHARDS. Every new run passes tenant admission (HARVEST_MAX_RUNS is
the read-only system limit; the algorithm and TFM live on shard 0 and are
changed with PUT /v1/admission or the /admin page). Operators manage weight
overrides, quotas and admission under /v1/queues, /v1/audit and
/v1/admission. SIGTERM or SIGINT stops it gracefully. OTEL_* variables
configure trace export; metrics are served at GET /metrics.
`}

// Main runs the gateway binary with the process arguments (without the
// program name) and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	var cfg Config
	if code, ok := binary.Start(args, stdout, stderr, &cfg); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, cfg, RunOptions{Logger: log}); err != nil {
		log.Error("gateway failed", "err", err)
		return config.ExitError
	}
	return config.ExitOK
}

// RunOptions are the optional parts of Run.
type RunOptions struct {
	Logger *slog.Logger
	// Ready, when set, receives the HTTP listener's address once the
	// gateway serves HTTP and NATS.
	Ready func(addr string)
	// Authorizer and Admitter are passed to the gateway.
	Authorizer Authorizer
	Admitter   tenantcap.Hook
}

// Run serves the gateway until ctx ends, then shuts it down gracefully:
// HTTP requests and NATS starts in progress are finished first.
func Run(ctx context.Context, cfg Config, o RunOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	// The tokens file is checked before anything else starts: a file the
	// loader refuses (a tenant's token with a config privilege, say) stops
	// the gateway here.
	var tokens *auth.Store
	if cfg.TokensFile != "" {
		var err error
		if tokens, err = auth.OpenStore(cfg.TokensFile); err != nil {
			return fmt.Errorf("HARVEST_GATEWAY_TOKENS_FILE: %w", err)
		}
	}
	shutdownTelemetry, err := telemetry.Setup(ctx, "harvest-gateway")
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTelemetry(sctx)
	}()

	if tokens != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan struct{})
		defer func() { cancel(); <-done }()
		go func() {
			defer close(done)
			_ = tokens.Watch(wctx, cfg.TokensFile, cfg.TokensPoll, auth.WatchOptions{
				Requests: auth.SignalRequests(wctx), Logger: log,
			})
		}()
	} else {
		log.Warn("HARVEST_GATEWAY_TOKENS_FILE is not set: every HTTP call that needs a token is refused")
	}

	nc, err := natsconn.Connect(cfg.NATSURL, natsconn.Options{
		Name: "harvest-gateway", Logger: log, Meanwhile: "NATS starts and wake-ups pause",
	})
	if err != nil {
		return fmt.Errorf("HARVEST_NATS_URL: %w", err)
	}
	defer nc.Close()

	g, err := New(Options{
		Config: cfg, Tokens: tokens, NATS: nc, Authorizer: o.Authorizer, Admitter: o.Admitter,
		Metrics: telemetry.MetricsHandler(), Logger: log,
	})
	if err != nil {
		return err
	}
	defer g.Close()
	// Unregistered (deferred later, so run earlier) before g.Close closes
	// the pools.
	for i, p := range g.Shards() {
		defer telemetry.RegisterPool(i, p)()
	}
	defer telemetry.RegisterNATS(nc)()
	migrate(ctx, g.Shards(), log)
	// A fresh shard 0 has its settings table only now.
	if err := g.adm.tryLoad(g.adm.ctx); err != nil {
		log.Warn("gateway: admission configuration not loaded yet (retried every second); new runs get 503 meanwhile", "err", err)
	}
	if err := g.ServeNATS(); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("HARVEST_GATEWAY_ADDR: %w", err)
	}
	srv := g.Server()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("gateway serving", "addr", ln.Addr().String(), "shards", len(cfg.Shards), "nats", nc.ConnectedUrlRedacted())
	if o.Ready != nil {
		o.Ready(ln.Addr().String())
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("gateway: HTTP server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait+5*time.Second)
	defer cancel()
	// Long polls answer now, with their run as last read, rather than
	// holding the shutdown for up to their wait.
	g.waits.close()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("gateway: HTTP shutdown", "err", err)
	}
	<-served
	return nil
}

// migrate applies missing migrations to every shard that answers. A shard
// that does not is only logged: its tenants get 503 until it is back, and
// the other tenants are served meanwhile.
func migrate(ctx context.Context, pools []*pgxpool.Pool, log *slog.Logger) {
	for i, p := range pools {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		v, err := schema.Migrate(mctx, p)
		cancel()
		if err != nil {
			log.Warn("gateway: cannot migrate shard; its tenants get 503 until it answers", "shard", i, "err", err)
			continue
		}
		log.Info("gateway: shard ready", "shard", i, "schema", v)
	}
}
