package startbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/client"
)

// Config describes a benchmark run.
type Config struct {
	// ServerURL is any database on the PostgreSQL server; a fresh
	// database is created beside it for the run.
	ServerURL string
	// NATSURL names a NATS server; empty starts an embedded one.
	NATSURL string
	// Transports to measure, in order: "http", "nats".
	Transports []string
	// Clients is the number of concurrent clients (8).
	Clients int
	// Duration is how long each transport is measured, after Warmup.
	Duration time.Duration
	Warmup   time.Duration
	// Keys spreads the starts over this many fairness keys (1: one key).
	Keys int
	// Tenants spreads the clients over this many tenants, client i being
	// tenant i mod Tenants (1: every client is the same tenant, the case
	// where all starts contend for one tenant's count).
	Tenants int
	// Flushers, when positive, overrides the gateway's start groups in
	// flight per shard.
	Flushers int
	// GroupMax, when positive, overrides the most starts per transaction
	// (1: a commit per start).
	GroupMax int
	// Out receives one JSON line per transport; Log progress (may be nil).
	Out io.Writer
	Log io.Writer
}

// Result is one transport's figures; latencies in milliseconds.
type Result struct {
	Bench     string  `json:"bench"`
	Transport string  `json:"transport"`
	Clients   int     `json:"clients"`
	Tenants   int     `json:"tenants"`
	Keys      int     `json:"keys"`
	Starts    int     `json:"starts"`
	Errors    int     `json:"errors"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"starts_per_s"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
}

// tenantName names the bench's i-th tenant.
func tenantName(i, tenants int) string {
	if tenants == 1 {
		return "bench"
	}
	return fmt.Sprintf("bench%d", i)
}

// Run runs the benchmark and writes one JSON line per transport to
// cfg.Out.
func Run(ctx context.Context, cfg Config) (_ []Result, err error) {
	if cfg.Clients <= 0 {
		cfg.Clients = 8
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Warmup < 0 {
		cfg.Warmup = 0
	}
	if cfg.Keys <= 0 {
		cfg.Keys = 1
	}
	if cfg.Tenants <= 0 {
		cfg.Tenants = 1
	}
	if len(cfg.Transports) == 0 {
		cfg.Transports = []string{"http", "nats"}
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}

	dbURL, drop, err := freshDatabase(ctx, cfg.ServerURL)
	if err != nil {
		return nil, err
	}
	logf("startbench: database %s (dropped at the end)", databaseName(dbURL))
	defer func() { err = errors.Join(err, drop()) }()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return nil, err
	}

	natsURL := cfg.NATSURL
	if natsURL == "" {
		ns, err := natsembed.Start(natsembed.Options{})
		if err != nil {
			return nil, err
		}
		defer ns.Shutdown()
		natsURL = ns.URL()
	}
	gwConn, err := natsconn.Connect(natsURL, natsconn.Options{Name: "bench-gateway", FailFast: true})
	if err != nil {
		return nil, err
	}
	defer gwConn.Close()

	var tokens []auth.FileEntry
	var secrets []string
	for i := range cfg.Tenants {
		secret, err := auth.NewSecret()
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, secret)
		tokens = append(tokens, auth.FileEntry{Name: tenantName(i, cfg.Tenants), Tenant: tenantName(i, cfg.Tenants),
			SHA256: auth.HashSecret(secret), Privileges: []string{"runs:start", "runs:read"}})
	}
	tokensJSON, err := json.Marshal(tokens)
	if err != nil {
		return nil, err
	}
	set, err := auth.ParseTokens(tokensJSON)
	if err != nil {
		return nil, err
	}
	gcfg := gateway.DefaultConfig([]string{dbURL}, natsURL)
	// The bench measures the start path, not admission: raise the system
	// limit explicitly so no start is refused.
	gcfg.MaxRuns = 1 << 30
	if cfg.Flushers > 0 {
		gcfg.GroupFlushers = cfg.Flushers
	}
	if cfg.GroupMax > 0 {
		gcfg.GroupMax = cfg.GroupMax
	}
	gw, err := gateway.New(gateway.Options{Config: gcfg, Tokens: auth.NewStore(set), NATS: gwConn,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	defer gw.Close()
	if err := gw.ServeNATS(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := gw.Server()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	var results []Result
	for _, tr := range cfg.Transports {
		var clients []*client.Client
		var prefixes []string
		for i := range cfg.Clients {
			var c *client.Client
			t := i % cfg.Tenants
			switch tr {
			case "http":
				hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
				c, err = client.New(client.Options{URL: "http://" + ln.Addr().String(), Token: secrets[t], HTTPClient: hc})
			case "nats":
				nc, cerr := natsconn.Connect(natsURL, natsconn.Options{Name: "bench-client", FailFast: true})
				if cerr != nil {
					return results, cerr
				}
				defer nc.Close()
				c, err = client.New(client.Options{NATS: nc, Tenant: tenantName(t, cfg.Tenants)})
			default:
				return results, fmt.Errorf("startbench: unknown transport %q (http, nats)", tr)
			}
			if err != nil {
				return results, err
			}
			clients = append(clients, c)
			// Keys belong to their tenant, as with key binding: tenants
			// share no fairness key.
			prefix := "k"
			if cfg.Tenants > 1 {
				prefix = fmt.Sprintf("t%d-k", t)
			}
			prefixes = append(prefixes, prefix)
		}
		logf("startbench: %s: warming up for %s, then measuring for %s with %d clients", tr, cfg.Warmup, cfg.Duration, cfg.Clients)
		if _, err := drive(ctx, clients, prefixes, cfg.Warmup, cfg.Keys); err != nil {
			return results, err
		}
		r, err := drive(ctx, clients, prefixes, cfg.Duration, cfg.Keys)
		if err != nil {
			return results, err
		}
		r.Transport, r.Tenants, r.Keys = tr, cfg.Tenants, cfg.Keys
		results = append(results, r)
		line, _ := json.Marshal(r)
		fmt.Fprintln(cfg.Out, string(line))
		// Keep the backlog from one transport out of the other's figures.
		if _, err := pool.Exec(ctx, `TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, tenant_running`); err != nil {
			return results, err
		}
	}
	return results, nil
}

// drive runs the clients in closed loops for d and collects latencies.
// Client i's keys are prefixes[i] followed by a number below keys.
func drive(ctx context.Context, clients []*client.Client, prefixes []string, d time.Duration, keys int) (Result, error) {
	r := Result{Bench: "starts", Clients: len(clients)}
	if d <= 0 {
		return r, nil
	}
	var (
		mu      sync.Mutex
		lat     []time.Duration
		errs    atomic.Int64
		firstEr atomic.Value
		seq     atomic.Int64
		wg      sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(d)
	for i, c := range clients {
		prefix := prefixes[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) && ctx.Err() == nil {
				n := seq.Add(1)
				t0 := time.Now()
				_, err := c.Start(ctx, "echo", "bench", map[string]int64{"n": n},
					client.StartOptions{FairnessKey: fmt.Sprintf("%s%d", prefix, n%int64(keys))})
				if err != nil {
					errs.Add(1)
					firstEr.CompareAndSwap(nil, err.Error())
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	slices.Sort(lat)
	r.Starts = len(lat)
	r.Errors = int(errs.Load())
	r.Seconds = round(elapsed.Seconds())
	r.PerSecond = round(float64(len(lat)) / elapsed.Seconds())
	r.P50, r.P99 = pct(lat, 50), pct(lat, 99)
	if len(lat) > 0 {
		r.Max = ms(lat[len(lat)-1])
	}
	if r.Errors > 0 && r.Starts == 0 {
		return r, fmt.Errorf("startbench: every start failed, first: %v", firstEr.Load())
	}
	return r, nil
}

func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	return ms(ds[min(max(i-1, 0), len(ds)-1)])
}

func ms(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }

func round(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// freshDatabase creates a database with a random name on the server of
// serverURL and returns its URL and a function that drops it.
func freshDatabase(ctx context.Context, serverURL string) (string, func() error, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "harvest_bench_" + hex.EncodeToString(b[:])
	admin := func(sql string) error {
		// Not ctx: the drop must run after a Ctrl-C too.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(actx, serverURL)
		if err != nil {
			return fmt.Errorf("startbench: connect to %s: %w", redact(serverURL), err)
		}
		defer conn.Close(actx)
		_, err = conn.Exec(actx, sql)
		return err
	}
	if err := admin(`CREATE DATABASE ` + name); err != nil {
		return "", nil, fmt.Errorf("startbench: create database: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() error {
		return admin(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
	}
	return u.String(), drop, nil
}

func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return raw
}

// databaseName is the database a URL names.
func databaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "?"
	}
	return strings.TrimPrefix(u.Path, "/")
}
