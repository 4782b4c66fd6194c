package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/sourcegraph/conc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// instrumentation is the name of the gateway's tracer and meter.
const instrumentation = "github.com/harvest-run/harvest/internal/gateway"

// Options are what a Gateway is made of besides its Config.
type Options struct {
	Config Config
	// Tokens authenticates HTTP callers. Nil refuses every call that needs
	// a token (401).
	Tokens *auth.Store
	// NATS is the connection the start service listens on and wake-ups,
	// dispatches and run events go out on. Nil: no NATS service and no
	// publishes (workers then find work by polling).
	NATS *nats.Conn
	// Authorizer, when set, may refuse any start.
	Authorizer Authorizer
	// Admitter, when set, replaces the gateway's own admission (pkg/tenantcap
	// configured by HARVEST_MAX_RUNS and the admission settings on shard 0).
	// The gateway's own is decided inside the start statement (it is a
	// tenantcap.Ruler); a hook set here that is not a Ruler is asked in Go,
	// start by start. Tests use it; a deployment leaves it nil.
	Admitter tenantcap.Hook
	// Now is the clock of the /admin sessions; nil means time.Now.
	Now func() time.Time
	// Metrics, when set, is served at GET /metrics.
	Metrics http.Handler
	// Logger receives the gateway's log lines; nil means slog.Default().
	Logger *slog.Logger
}

// Gateway serves starts and run reads over HTTP and NATS.
type Gateway struct {
	cfg      Config
	tokens   *auth.Store
	nc       *nats.Conn
	authz    Authorizer
	metrics  http.Handler
	log      *slog.Logger
	subjects dispatch.Subjects

	shards []*pgxpool.Pool
	// leasePools are small pools of their own for moving capacity
	// leases: a start that runs out of its shard's lease takes more while
	// its transaction holds a connection of the shard pool, and must not
	// wait for that pool's connections, which other such starts may hold.
	leasePools []*pgxpool.Pool
	// probePools are the one-connection pools of /readyz (shed.go), so
	// that a shard pool full of starts does not read as a shard down.
	probePools []*pgxpool.Pool
	ready      readiness
	// shedders are the shards' budgets of starts in flight (shed.go).
	shedders    []*shedder
	shedMetrics shedMetrics
	committers  []*runstore.Committer
	// dir knows each tenant's home shard (the directory on shard 0).
	dir *directory.Directory

	adm *admission
	// admitter decides new runs: the committers' and deferred starts'.
	admitter tenantcap.Hook
	// console serves /admin (console.go); it holds the browsers' sessions.
	console *console.Console

	tracer   trace.Tracer
	meter    metric.Meter
	starts   metric.Int64Counter
	duration metric.Float64Histogram
	groups   metric.Int64Histogram
	// outcomeAttrs caches the metric attributes of each (transport,
	// outcome) pair: building an attribute set per start costs more than
	// the rest of the bookkeeping.
	outcomeAttrs sync.Map // outcomeKey -> metric.MeasurementOption

	// waits holds the long polls of GET /v1/runs/{id}?wait= (waiters.go).
	waits *waitHub
	// lists bounds each tenant's run listings in flight (lists.go).
	lists *listBound

	natsMu   sync.Mutex
	subs     []*nats.Subscription
	inflight chan struct{}
	handlers conc.WaitGroup

	closeOnce sync.Once
}

// New makes a gateway: one connection pool and one group committer per
// shard. Pools connect lazily, so a shard that is down at start makes only
// its tenants' calls fail (503), not the gateway. Call ServeNATS to take
// NATS starts, Handler for the HTTP API, and Close at the end.
func New(opts Options) (*Gateway, error) {
	cfg := opts.Config
	if len(cfg.Shards) == 0 {
		return nil, errors.New("gateway: no shards (HARVEST_SHARDS)")
	}
	g := &Gateway{
		cfg:      cfg,
		tokens:   opts.Tokens,
		nc:       opts.NATS,
		authz:    opts.Authorizer,
		metrics:  opts.Metrics,
		log:      opts.Logger,
		subjects: dispatch.Subjects{Prefix: cfg.SubjectPrefix},
		tracer:   otel.Tracer(instrumentation),
		inflight: make(chan struct{}, max(cfg.NATSInflight, 1)),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.tokens == nil {
		g.tokens = auth.NewStore(nil)
	}
	if !cfg.KeyBinding {
		// A protection turned off is said once, loudly, at start.
		g.log.Warn("gateway: key binding is off (HARVEST_GATEWAY_KEY_BINDING=false): any tenant may name any fairness or quota key, take another tenant's weight and fill its quota")
	}
	if err := g.initMetrics(); err != nil {
		return nil, err
	}
	var err error
	if g.lists, err = newListBound(cfg.MaxListsPerTenant, g.meter); err != nil {
		return nil, err
	}
	if g.waits, err = newWaitHub(cfg, g.meter); err != nil {
		return nil, err
	}
	if err := g.initShedding(); err != nil {
		return nil, err
	}
	g.ready.ping = func(ctx context.Context, shard int) error { return pgpool.Ping(ctx, g.probePools[shard]) }
	for i, raw := range cfg.Shards {
		pc, err := pgxpool.ParseConfig(raw)
		if err != nil {
			g.closePools()
			return nil, fmt.Errorf("gateway: HARVEST_SHARDS: shard %d (%s): %w", i, config.Redact(raw), err)
		}
		if cfg.PoolSize > 0 {
			pc.MaxConns = cfg.PoolSize
		}
		if cfg.ConnectTimeout > 0 {
			pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
		}
		telemetry.PoolConfig(pc)
		// pgpool: the shard's pools follow a change of its primary.
		pool, err := pgpool.New(context.Background(), i, pgpool.AppGateway, pc)
		if err != nil {
			g.closePools()
			return nil, fmt.Errorf("gateway: shard %d (%s): %w", i, config.Redact(raw), err)
		}
		g.shards = append(g.shards, pool)
		lc := pc.Copy()
		lc.MaxConns, lc.MinConns = leasePoolSize, 0
		lp, err := pgpool.New(context.Background(), i, pgpool.AppGateway, lc)
		if err != nil {
			g.closePools()
			return nil, fmt.Errorf("gateway: shard %d (%s): %w", i, config.Redact(raw), err)
		}
		g.leasePools = append(g.leasePools, lp)
		pp, err := probePoolOf(i, pc)
		if err != nil {
			g.closePools()
			return nil, fmt.Errorf("gateway: shard %d (%s): %w", i, config.Redact(raw), err)
		}
		g.probePools = append(g.probePools, pp)
	}
	g.dir = directory.New(directory.Options{
		Shard0: g.shards[0], Shards: len(g.shards), NATS: g.nc, Prefix: cfg.SubjectPrefix,
		Refresh: cfg.DirectoryRefresh, Log: g.log,
	})
	if err := g.initAdmission(); err != nil {
		g.closePools()
		return nil, err
	}
	admitter := opts.Admitter
	if admitter == nil {
		admitter = admitHook{g.adm}
	}
	g.admitter = admitter
	g.console = newConsole(g, opts.Now)
	for i, pool := range g.shards {
		shard := i
		g.committers = append(g.committers, runstore.NewCommitter(pool, i, runstore.CommitterOptions{
			MaxBatch: cfg.GroupMax,
			Flushers: cfg.GroupFlushers,
			Linger:   cfg.GroupLinger,
			Admitter: admitter,
			AfterCommit: func(c []runstore.Committed) {
				g.groups.Record(context.Background(), int64(len(c)))
				g.publishStarted(shard, c)
			},
		}))
	}
	if g.nc != nil {
		// The run events of every tenant (<prefix>.runs.*.>) wake the
		// long polls. Without them waits still end, by rereading.
		if err := g.waits.listenNATS(g.nc, g.subjects.RunsOf("*")); err != nil {
			g.log.Warn("gateway: long polls reread their run every HARVEST_GATEWAY_WAIT_POLL instead of waking on its event", "err", err)
		}
	}
	return g, nil
}

// Shards returns the shard pools, in shard order (for tests and tools).
func (g *Gateway) Shards() []*pgxpool.Pool { return g.shards }

// Close releases the long polls (each answers at once with its run as it
// last read it), stops the NATS service (draining requests in progress),
// then the committers (committing starts already handed in), then the
// pools.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		g.waits.close()
		g.natsMu.Lock()
		for _, s := range g.subs {
			_ = s.Unsubscribe()
		}
		g.subs = nil
		g.natsMu.Unlock()
		g.handlers.Wait()
		for _, c := range g.committers {
			c.Close()
		}
		g.adm.close()
		g.closePools()
	})
}

func (g *Gateway) closePools() {
	for _, p := range append(append(g.shards, g.leasePools...), g.probePools...) {
		p.Close()
	}
}

// leasePoolSize is the connections per shard for capacity leases: a
// transfer uses one at a time, and a start waiting for capacity holds
// none of them.
const leasePoolSize = 2

type outcomeKey struct{ transport, outcome string }

// outcomeOption returns the attributes of a start's metrics.
func (g *Gateway) outcomeOption(transport, outcome string) metric.MeasurementOption {
	k := outcomeKey{transport, outcome}
	if o, ok := g.outcomeAttrs.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(attribute.String("transport", transport), attribute.String("outcome", outcome)))
	g.outcomeAttrs.Store(k, o)
	return o
}

func (g *Gateway) initMetrics() error {
	m := otel.Meter(instrumentation)
	g.meter = m
	var err error
	if g.starts, err = m.Int64Counter("harvest.gateway.starts",
		metric.WithDescription("Starts answered by the gateway, by transport and outcome (error code, or created/replayed)."),
		metric.WithUnit("{start}")); err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	if g.duration, err = m.Float64Histogram("harvest.gateway.start.duration",
		metric.WithDescription("Time from a start's arrival to its answer."),
		metric.WithUnit("s"),
		// From half a millisecond (a replay) to the ten seconds a start
		// may wait for an unreachable shard.
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	if g.groups, err = m.Int64Histogram("harvest.gateway.commit.group_size",
		metric.WithDescription("New runs per committed start transaction (group commit)."),
		metric.WithUnit("{run}"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 48, 64)); err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	return nil
}
