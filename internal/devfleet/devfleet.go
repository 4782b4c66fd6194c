// Package devfleet runs a whole Harvest installation inside one process for
// `harvest dev`: an embedded NATS server with the per-tenant permissions of
// deploy/, shard databases (two unless asked for more), one gateway and
// one fair worker per shard, with tokens made for the occasion. Everything it makes is removed when it
// stops.
package devfleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/pgcluster"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

// DefaultDatabaseURL is the server tried first when Options.DatabaseURL is
// empty.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Defaults of the listening addresses. When the default port is taken, Run
// falls back to a free port (an explicit choice that is taken is an error).
const (
	DefaultHTTPAddr = "127.0.0.1:8080"
	DefaultNATSPort = 4222
)

// DefaultMaxRuns is the system limit of unfinished runs in dev: high enough
// that the demos are not refused (a deployed gateway defaults to 128).
const DefaultMaxRuns = 100000

// Shard counts of Options.Shards.
const (
	DefaultShards = 2
	// MaxShards keeps the fleet's connections within the PostgreSQL
	// server's (see connectionsPerShard); it is not a limit of Harvest.
	MaxShards = 8
)

// connectionsPerShard is the most connections the fleet opens to one
// shard: the gateway's pool (gateway.DefaultConfig's 8) and lease pool (2),
// and the worker's pool (workerPoolSize).
const connectionsPerShard = 8 + 2 + workerPoolSize

// workerPoolSize is the connections of a dev worker's pool.
const workerPoolSize = 12

// Queue is the queue the dev workers serve when Options.Queues is empty.
const Queue = "default"

// ParseQueues reads the value of harvest dev's --queues flag: queue names
// separated by commas, each with an optional ":N", its share of the
// workers' claims (1 when absent), as in "orders,emails:3". Errors name
// the flag, since that is where the user has to look.
func ParseQueues(v string) (map[string]float64, error) {
	out := map[string]float64{}
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		name, share, hasShare := strings.Cut(part, ":")
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, fmt.Errorf("--queues %q: a queue name is empty (want name[:share],...)", v)
		}
		w := 1.0
		if hasShare {
			n, err := strconv.Atoi(strings.TrimSpace(share))
			if err != nil || n < 1 || n > 1_000_000 {
				return nil, fmt.Errorf("--queues %q: queue %q: share %q is not a whole number from 1 to 1000000", v, name, share)
			}
			w = float64(n)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--queues %q: queue %q is named twice", v, name)
		}
		out[name] = w
	}
	return out, nil
}

// QueueList formats queues as ParseQueues reads them, in name order.
func QueueList(queues map[string]float64) string {
	names := slices.Sorted(maps.Keys(queues))
	for i, n := range names {
		if w := queues[n]; w != 1 {
			names[i] = n + ":" + strconv.FormatFloat(w, 'f', -1, 64)
		}
	}
	return strings.Join(names, ",")
}

// tenantNames are the tenants of the dev fleet: the users of
// deploy/nats/nats.conf.
var tenantNames = []string{"acme", "globex", "initech"}

// Options configure Run. The zero value is ready to use.
type Options struct {
	// DatabaseURL is the admin URL of a PostgreSQL server allowed to
	// create and drop databases; DefaultDatabaseURL when empty. When
	// nothing answers there, Run starts a throwaway server instead.
	DatabaseURL string
	// HTTPAddr is the gateway's listen address; empty means
	// DefaultHTTPAddr, or a free port when that one is taken.
	HTTPAddr string
	// NATSPort is the client port of the embedded NATS server on
	// 127.0.0.1; zero means DefaultNATSPort, or a free port when that one
	// is taken.
	NATSPort int
	// MaxRuns is the system limit of unfinished runs (HARVEST_MAX_RUNS);
	// zero means DefaultMaxRuns.
	MaxRuns int
	// Shards is how many shard databases to make, 1 to MaxShards, each
	// with a worker of its own; zero means DefaultShards.
	Shards int
	// TraceStdout, when set, receives every finished span as JSON.
	TraceStdout io.Writer
	// Logger receives the fleet's log lines; nil discards them.
	Logger *slog.Logger
	// Queues are the queues the workers serve, each with its share of the
	// claims (see ParseQueues); empty means Queue alone.
	Queues map[string]float64
}

// Tenant is one demo tenant with its credentials.
type Tenant struct {
	Name         string
	Token        string // bearer secret for the HTTP API (runs:start, runs:read)
	NATSUser     string
	NATSPassword string
	Shard        int // home shard
}

// Fleet describes a running dev fleet.
type Fleet struct {
	GatewayURL string   // http://host:port
	NATSURL    string   // nats://127.0.0.1:port (credentials not included)
	Shards     []string // shard database URLs, in shard order
	AdminToken string   // bearer secret with every privilege
	// Tenants come in an order where the first two share a home shard
	// when two of them do (always with up to 4 shards), so that a demo
	// with tenants 1 and 2 shows fairness inside one shard.
	Tenants  []Tenant
	Postgres string // what serves the shards, for people
	MaxRuns  int
	// Queues are the queues the workers serve, with their shares.
	Queues map[string]float64
}

// EnvLines returns the NAME=value lines of `harvest dev --env-file`.
func (f *Fleet) EnvLines() []string {
	lines := []string{
		"HARVEST_GATEWAY_URL=" + f.GatewayURL,
		"HARVEST_NATS_URL=" + f.NATSURL,
		"HARVEST_SHARDS=" + strings.Join(f.Shards, ","),
		// The CLI's moves take capacity from the same system limit.
		"HARVEST_MAX_RUNS=" + strconv.Itoa(f.MaxRuns),
		"HARVEST_ADMIN_TOKEN=" + f.AdminToken,
	}
	for i, t := range f.Tenants {
		n := strconv.Itoa(i + 1)
		lines = append(lines,
			"HARVEST_TENANT_"+n+"_NAME="+t.Name,
			"HARVEST_TENANT_"+n+"_TOKEN="+t.Token,
			"HARVEST_TENANT_"+n+"_NATS_USER="+t.NATSUser,
			"HARVEST_TENANT_"+n+"_NATS_PASSWORD="+t.NATSPassword,
		)
	}
	return lines
}

// cleanups is a stack of undo steps, run last first.
type cleanups struct {
	mu    sync.Mutex
	steps []func() error
}

func (c *cleanups) push(f func() error) {
	c.mu.Lock()
	c.steps = append(c.steps, f)
	c.mu.Unlock()
}

func (c *cleanups) run() error {
	c.mu.Lock()
	steps := c.steps
	c.steps = nil
	c.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		errs = append(errs, steps[i]())
	}
	return errors.Join(errs...)
}

// Run starts the fleet, calls ready once the gateway and every worker take
// starts, and serves until ctx ends. Then it stops everything and removes
// what it made: the shard databases, the temporary directory (tokens file,
// NATS configuration and store) and the throwaway PostgreSQL server, if it
// started one. It returns nil after a clean stop.
func Run(ctx context.Context, o Options, ready func(*Fleet)) (err error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.MaxRuns == 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	if o.DatabaseURL == "" {
		o.DatabaseURL = DefaultDatabaseURL
	}
	if len(o.Queues) == 0 {
		o.Queues = map[string]float64{Queue: 1}
	}
	if o.Shards == 0 {
		o.Shards = DefaultShards
	}
	if o.Shards < 1 || o.Shards > MaxShards {
		return fmt.Errorf("dev: --shards %d: want 1 to %d", o.Shards, MaxShards)
	}
	var undo cleanups
	defer func() {
		if cerr := undo.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("dev: clean-up: %w", cerr))
		}
	}()
	// Set-up steps must finish even when ctx ends half-way, so that each
	// one's clean-up is registered; ctx is checked between steps.
	setupCtx := context.WithoutCancel(ctx)

	httpAddr, err := pickAddr(o.HTTPAddr, DefaultHTTPAddr, "--http")
	if err != nil {
		return err
	}
	natsPort := o.NATSPort
	if natsPort == 0 {
		a, err := pickAddr("", net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultNATSPort)), "--nats-port")
		if err != nil {
			return err
		}
		_, p, _ := net.SplitHostPort(a)
		natsPort, _ = strconv.Atoi(p)
	}

	dir, err := os.MkdirTemp("", "harvest-dev-")
	if err != nil {
		return fmt.Errorf("dev: temporary directory: %w", err)
	}
	undo.push(func() error { return os.RemoveAll(dir) })

	var topts []telemetry.Option
	if o.TraceStdout != nil {
		topts = append(topts, telemetry.WithStdout(o.TraceStdout))
	}
	shutdownTelemetry, err := telemetry.Shared(setupCtx, "harvest-dev", topts...)
	if err != nil {
		return err
	}
	undo.push(func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return shutdownTelemetry(sctx)
	})

	// PostgreSQL: the machine's server, or a throwaway one.
	f := &Fleet{MaxRuns: o.MaxRuns, Queues: maps.Clone(o.Queues)}
	adminURL := o.DatabaseURL
	if perr := probe(setupCtx, adminURL); perr != nil {
		if !dberr.Unreachable(perr) {
			return fmt.Errorf("dev: the PostgreSQL server at %s refused the connection: %w (fix HARVEST_DATABASE_URL or the server)",
				redact(adminURL), perr)
		}
		log.Info("no PostgreSQL server answers; starting a throwaway one", "tried", redact(adminURL))
		c, err := pgcluster.Start(setupCtx, pgcluster.Options{})
		if err != nil {
			return fmt.Errorf("dev: no PostgreSQL server answers at %s (%v), and starting a throwaway one failed: %w",
				redact(adminURL), perr, err)
		}
		undo.push(func() error {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return c.Stop(sctx)
		})
		adminURL = c.URL("postgres")
		f.Postgres = fmt.Sprintf("throwaway server at 127.0.0.1:%d (directory %s)", c.Port(), c.Dir())
	} else {
		f.Postgres = "the server at " + redact(adminURL)
	}
	// The default fleet ran on any server before shards were a choice;
	// only a larger one is checked.
	if o.Shards > DefaultShards {
		if err := checkConnections(setupCtx, adminURL, o.Shards); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil
	}

	// The shard databases, with names of their own. A tenant's home is
	// recorded on shard 0 by the gateway at its first start, by the same
	// rendezvous hash as Tenant.Shard below, so the summary holds.
	base := "harvest_dev_" + randomHex(6)
	for i := range o.Shards {
		name := fmt.Sprintf("%s_%d", base, i)
		if err := adminExec(setupCtx, adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
			return fmt.Errorf("dev: create database %s: %w", name, err)
		}
		undo.push(func() error {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := adminExec(sctx, adminURL, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				return fmt.Errorf("drop database %s: %w", name, err)
			}
			return nil
		})
		u := withDatabase(adminURL, name)
		if err := migrate(setupCtx, u); err != nil {
			return fmt.Errorf("dev: migrate %s: %w", name, err)
		}
		f.Shards = append(f.Shards, u)
	}

	// Credentials: an administrator token, and per tenant a token and a
	// NATS user; a service user for the gateway and workers.
	f.AdminToken = mustSecret()
	servicePW := mustSecret()
	tokens := []string{fmt.Sprintf(`{"name":"dev-admin","sha256":%q,"privileges":["runs:start","runs:read","weights:read","weights:write","config:read","config:write"]}`,
		auth.HashSecret(f.AdminToken))}
	natsOpts := natsauth.Options{
		Comment:  "harvest dev: made for this run, removed when it stops.",
		Services: []natsauth.User{{Name: "harvest", Password: natsauth.Plain(servicePW)}},
		Handlers: []natsauth.User{{Name: "handlers", Password: natsauth.Plain(mustSecret())}},
	}
	for _, name := range orderTenants(tenantNames, len(f.Shards)) {
		t := Tenant{Name: name, Token: mustSecret(), NATSUser: name, NATSPassword: mustSecret(),
			Shard: shards.Home(name, len(f.Shards))}
		f.Tenants = append(f.Tenants, t)
		tokens = append(tokens, fmt.Sprintf(`{"name":"dev-%s","tenant":%q,"sha256":%q,"privileges":["runs:start","runs:read","weights:read"]}`,
			name, name, auth.HashSecret(t.Token)))
		natsOpts.Tenants = append(natsOpts.Tenants, natsauth.TenantUser{Name: name, Password: natsauth.Plain(t.NATSPassword), Tenant: name})
	}
	tokensFile := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokensFile, []byte("[\n"+strings.Join(tokens, ",\n")+"\n]\n"), 0o600); err != nil {
		return fmt.Errorf("dev: tokens file: %w", err)
	}
	conf, err := natsauth.Config(natsOpts)
	if err != nil {
		return fmt.Errorf("dev: NATS configuration: %w", err)
	}
	confFile := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("dev: NATS configuration: %w", err)
	}

	// NATS.
	ns, err := natsembed.Start(natsembed.Options{Port: natsPort, ConfigFile: confFile, Dir: dir})
	if err != nil {
		return fmt.Errorf("dev: NATS on port %d: %w", natsPort, err)
	}
	undo.push(func() error { ns.Shutdown(); return nil })
	f.NATSURL = ns.URL()
	serviceURL := withUser(ns.URL(), "harvest", servicePW)
	if err := ctx.Err(); err != nil {
		return nil
	}

	// Gateway.
	gcfg := gateway.DefaultConfig(f.Shards, serviceURL)
	gcfg.Addr = httpAddr
	gcfg.TokensFile = tokensFile
	gcfg.MaxRuns = o.MaxRuns
	// Each tenant's runs are their own fairness key unless the caller
	// names one (acme/k), so tenants share a queue fairly out of the box.
	gcfg.KeyBinding = true
	gcfg.MaxWait = 60 * time.Second
	if err := gcfg.Validate(); err != nil {
		return fmt.Errorf("dev: gateway configuration: %w", err)
	}
	gctx, stopGateway := context.WithCancel(context.WithoutCancel(ctx))
	gready := make(chan string, 1)
	gdone := make(chan error, 1)
	go func() {
		gdone <- gateway.Run(gctx, gcfg, gateway.RunOptions{
			Logger: log.With("service", "gateway"),
			Ready:  func(addr string) { gready <- addr },
		})
	}()
	undo.push(func() error {
		stopGateway()
		if err := <-gdone; err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		return nil
	})
	select {
	case addr := <-gready:
		f.GatewayURL = "http://" + addr
	case err := <-gdone:
		gdone <- err // for the clean-up step
		return fmt.Errorf("dev: gateway: %w", err)
	}

	if err := warnUnserved(&undo, log, serviceURL, f.Queues); err != nil {
		return err
	}

	// Workers: one per shard, fairness on.
	for i := range f.Shards {
		if err := startWorker(ctx, &undo, log, f.Shards[i], i, serviceURL, f.Queues); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if ready != nil {
		ready(f)
	}
	<-ctx.Done()
	log.Info("stopping the dev fleet")
	return nil
}

// startWorker runs one worker on shard i until the clean-up step stops it;
// it returns once the worker claims.
func startWorker(ctx context.Context, undo *cleanups, log *slog.Logger, shardURL string, i int, natsURL string, queues map[string]float64) error {
	pcfg, err := pgxpool.ParseConfig(shardURL)
	if err != nil {
		return fmt.Errorf("dev: worker %d: %w", i, err)
	}
	telemetry.PoolConfig(pcfg)
	pcfg.MaxConns = workerPoolSize
	pool, err := pgpool.New(context.WithoutCancel(ctx), i, pgpool.AppWorker, pcfg)
	if err != nil {
		return fmt.Errorf("dev: worker %d: %w", i, err)
	}
	undo.push(func() error { pool.Close(); return nil })

	nc, err := natsconn.Connect(natsURL, natsconn.Options{
		Name: fmt.Sprintf("harvest-dev-worker-%d", i), Logger: log.With("service", "worker"), Meanwhile: "polling", FailFast: true,
	})
	if err != nil {
		return fmt.Errorf("dev: worker %d: NATS: %w", i, err)
	}
	undo.push(func() error { nc.Close(); return nil })

	cfg := worker.DefaultConfig()
	cfg.Shard = i
	cfg.Queues = maps.Clone(queues)
	cfg.FairnessKeys = true
	cfg.ID = fmt.Sprintf("dev-worker-%d", i)
	cfg.ShutdownGrace = 5 * time.Second
	subj := dispatch.Subjects{}
	w, err := worker.New(pool, cfg, worker.Options{
		NATS: nc, Subjects: subj, Logger: log.With("service", "worker"),
		Fallback: workerbin.Bridge{NC: nc, Subjects: subj, Timeout: time.Minute},
	})
	if err != nil {
		return fmt.Errorf("dev: worker %d: %w", i, err)
	}
	workerbin.RegisterDemo(w)
	unregister, err := worker.BacklogMetrics(pool, i, cfg.QueueNames())
	if err != nil {
		return err
	}
	undo.push(unregister)

	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	undo.push(func() error {
		stop()
		if err := <-done; err != nil {
			return fmt.Errorf("worker %d: %w", i, err)
		}
		return nil
	})
	select {
	case <-w.Ready():
		return nil
	case err := <-done:
		done <- err
		return fmt.Errorf("dev: worker %d: %w", i, err)
	}
}

// warnUnserved logs a warning, once per queue, when a run is started on a
// queue no dev worker serves: such a run waits for ever without a word,
// which looks like a hang. The gateway publishes a wake-up on the queue's
// subject after every start due now, so listening to all of them sees
// every queue in use.
func warnUnserved(undo *cleanups, log *slog.Logger, natsURL string, served map[string]float64) error {
	nc, err := natsconn.Connect(natsURL, natsconn.Options{Name: "harvest-dev-queue-watch", FailFast: true})
	if err != nil {
		return fmt.Errorf("dev: queue watch: NATS: %w", err)
	}
	undo.push(func() error { nc.Close(); return nil })
	// Wake(shard, queue) ends in ".<shard>.<queue>"; the rest is the stem
	// every wake subject shares.
	stem := strings.TrimSuffix(dispatch.Subjects{}.Wake(0, "q"), "0.q")
	list := QueueList(served)
	var mu sync.Mutex
	warned := map[string]bool{}
	_, err = nc.Subscribe(stem+"*.*", func(m *nats.Msg) {
		tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		q, err := dispatch.DecodeToken(tok)
		if err != nil {
			return
		}
		if _, ok := served[q]; ok {
			return
		}
		mu.Lock()
		first := !warned[q]
		warned[q] = true
		mu.Unlock()
		if first {
			log.Warn(fmt.Sprintf("a run was started on queue %q, which no dev worker serves, so it waits; restart harvest dev with --queues %s,%s to serve it", q, list, q),
				"queue", q, "served", list)
		}
	})
	if err != nil {
		return fmt.Errorf("dev: queue watch: subscribe: %w", err)
	}
	// The subscription must be in place before the fleet reports ready,
	// or a start right after could slip by unseen.
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("dev: queue watch: %w", err)
	}
	return nil
}

// orderTenants puts first two tenants that share a home shard among n
// shards (there always are two among three tenants and two shards; with
// the dev tenants, also with three or four). When none do, the order is
// left as it is.
func orderTenants(names []string, n int) []string {
	out := slices.Clone(names)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if shards.Home(out[i], n) == shards.Home(out[j], n) {
				first, second := out[i], out[j]
				rest := slices.DeleteFunc(slices.Clone(out), func(s string) bool { return s == first || s == second })
				return append([]string{first, second}, rest...)
			}
		}
	}
	return out
}

// pickAddr returns addr when set (the caller's explicit choice, used as
// is). Otherwise it returns def when that port is free, or a free port of
// the same host.
func pickAddr(addr, def, flag string) (string, error) {
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", fmt.Errorf("dev: %s %q: want host:port: %v", flag, addr, err)
		}
		return addr, nil
	}
	l, err := net.Listen("tcp", def)
	if err == nil {
		_ = l.Close()
		return def, nil
	}
	host, _, _ := net.SplitHostPort(def)
	l, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("dev: no free port for %s: %w", flag, err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func mustSecret() string {
	s, err := auth.NewSecret()
	if err != nil {
		panic(err)
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func migrate(ctx context.Context, dbURL string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = schema.Migrate(ctx, conn)
	return err
}

// checkConnections refuses a fleet that could open more connections than
// the server takes: the failure would otherwise come later, as "too many
// clients" in the middle of a demo.
func checkConnections(ctx context.Context, adminURL string, shards int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("dev: %s: %w", redact(adminURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	if err := conn.QueryRow(ctx, "SHOW max_connections").Scan(&s); err != nil {
		return fmt.Errorf("dev: read max_connections: %w", err)
	}
	limit, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("dev: max_connections %q: %w", s, err)
	}
	if need := shards * connectionsPerShard; need > limit {
		return fmt.Errorf("dev: --shards %d: the fleet may open %d connections (%d a shard), but the PostgreSQL server at %s takes %d (max_connections): ask for fewer shards, or raise max_connections",
			shards, need, connectionsPerShard, redact(adminURL), limit)
	}
	return nil
}

// probe makes one short connection attempt to adminURL.
func probe(ctx context.Context, adminURL string) error {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

func adminExec(ctx context.Context, adminURL, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase points a postgres:// URL at database db.
func withDatabase(adminURL, db string) string {
	u, err := url.Parse(adminURL)
	if err != nil {
		return adminURL
	}
	u.Path = "/" + db
	u.RawPath = ""
	return u.String()
}

func withUser(natsURL, user, password string) string {
	u, err := url.Parse(natsURL)
	if err != nil {
		return natsURL
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return raw
}
