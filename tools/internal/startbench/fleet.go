package startbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/fleetbench"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// benchQueue is the queue of the sustained benchmark's runs; its workers
// serve it alone.
const benchQueue = "bench"

// FleetConfig describes the processes a sustained benchmark starts.
type FleetConfig struct {
	// ServerURL is any database on the PostgreSQL server; the shards are
	// fresh databases beside it, dropped at the end.
	ServerURL string
	// GatewayBin and WorkerBin are the binaries (cmd/gateway, cmd/worker).
	GatewayBin, WorkerBin string
	// Shards is the number of shard databases (2, as harvest dev), each
	// with one worker process.
	Shards int
	// Gateways is the number of gateway processes (1).
	Gateways int
	// Tenants is the number of tenants (3, as harvest dev).
	Tenants int
	// GatewayEnv and WorkerEnv are added to the processes' environments
	// (NAME=value), after what the fleet sets.
	GatewayEnv, WorkerEnv []string
	// Dir holds the tokens file (a temporary directory when empty).
	Dir string
}

// fleet is a running set of shard databases, an embedded NATS server,
// gateway processes and one worker process per shard, all on the
// binaries' defaults except what a benchmark must set.
type fleet struct {
	cfg       FleetConfig
	logf      func(format string, args ...any)
	ns        *natsembed.Server
	shardURLs []string
	pools     []*pgxpool.Pool
	drops     []func() error
	dir       string
	ownDir    bool
	tokens    string
	tenants   []string
	secrets   []string
	gwAddrs   []string
	gws       []*soak.Proc
	workers   []*soak.Proc
	// natsConns are the benchmark's own NATS connections (clients).
	natsConns []*nats.Conn
	// stopVacuum ends the vacuum loop (vacuumShards) and waits for it.
	stopVacuum func()
}

// vacuumEvery is how often the fleet's shards are vacuumed and analysed
// in place of autovacuum, which this machine's server has off. Without it
// every claim leaves dead entries in the partial indexes of pending and
// running tasks and nothing ever gathers statistics, so a run measures a
// database no production server would present: plans chosen blind over
// indexes that only grow (a count of the unclaimed runs took 13 s on one
// shard). The mix harness does the same (soak's vacuumAsWorkload).
const vacuumEvery = 10 * time.Second

// vacuumShards vacuums and analyses runs and tasks on every shard every
// vacuumEvery until the returned function is called, which waits for the
// round in progress.
func vacuumShards(urls []string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(vacuumEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, u := range urls {
				c, err := pgx.Connect(ctx, u)
				if err != nil {
					continue
				}
				_, _ = c.Exec(ctx, `VACUUM (ANALYZE, SKIP_LOCKED) runs, tasks`)
				_ = c.Close(context.Background())
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// tenantOf names the benchmark's i-th tenant.
func tenantOf(i int) string { return fmt.Sprintf("tenant%d", i) }

// startFleet brings the fleet up: databases (migrated), NATS, the
// gateways (ready) and the workers (claiming). On error what was started
// is stopped.
func startFleet(ctx context.Context, cfg FleetConfig, logf func(string, ...any)) (f *fleet, err error) {
	if cfg.Shards <= 0 {
		cfg.Shards = 2
	}
	if cfg.Gateways <= 0 {
		cfg.Gateways = 1
	}
	if cfg.Tenants <= 0 {
		cfg.Tenants = 3
	}
	f = &fleet{cfg: cfg, logf: logf, dir: cfg.Dir}
	defer func() {
		if err != nil {
			f.close()
			f = nil
		}
	}()
	if f.dir == "" {
		if f.dir, err = os.MkdirTemp("", "harvest-sustain-"); err != nil {
			return f, err
		}
		f.ownDir = true
	}
	for i := range cfg.Shards {
		u, drop, err := fleetbench.FreshDatabase(ctx, cfg.ServerURL, "harvest_sustain_")
		if err != nil {
			return f, err
		}
		f.drops = append(f.drops, drop)
		f.shardURLs = append(f.shardURLs, u)
		pc, err := pgxpool.ParseConfig(u)
		if err != nil {
			return f, err
		}
		pc.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return f, err
		}
		f.pools = append(f.pools, pool)
		if _, err := schema.Migrate(ctx, pool); err != nil {
			return f, fmt.Errorf("startbench: migrate shard %d: %w", i, err)
		}
	}
	if f.ns, err = natsembed.Start(natsembed.Options{}); err != nil {
		return f, err
	}
	if err := f.writeTokens(); err != nil {
		return f, err
	}
	for i := range cfg.Gateways {
		port, err := freePort()
		if err != nil {
			return f, err
		}
		f.gwAddrs = append(f.gwAddrs, "127.0.0.1:"+strconv.Itoa(port))
		f.gws = append(f.gws, nil)
		if _, err := f.startGateway(ctx, i); err != nil {
			return f, err
		}
	}
	for i := range cfg.Shards {
		env := append(baseEnv(),
			"HARVEST_SHARDS="+strings.Join(f.shardURLs, ","),
			"HARVEST_NATS_URL="+f.ns.URL(),
			"HARVEST_WORKER_SHARD="+strconv.Itoa(i),
			"HARVEST_WORKER_QUEUES="+benchQueue+":1",
			"HARVEST_WORKER_FAIRNESS_KEYS=true",
			// echo is a demo workflow, which the stock worker runs only
			// when asked.
			"HARVEST_WORKER_DEMO_HANDLERS=true",
			"HARVEST_WORKER_METRICS_ADDR=",
			"HARVEST_WORKER_ID=sustain-"+strconv.Itoa(i),
		)
		env = append(env, cfg.WorkerEnv...)
		p, err := soak.StartProc(fmt.Sprintf("worker-%d", i), soak.Command{Path: cfg.WorkerBin}, env)
		if err != nil {
			return f, err
		}
		f.workers = append(f.workers, p)
	}
	for i, p := range f.workers {
		if err := waitLog(ctx, p, "worker started", time.Minute); err != nil {
			return f, fmt.Errorf("startbench: worker %d: %w", i, err)
		}
	}
	f.stopVacuum = vacuumShards(f.shardURLs)
	return f, nil
}

// startGateway starts gateway i on its address and returns once its
// /readyz answers 200, with how long that took from the process's start.
func (f *fleet) startGateway(ctx context.Context, i int) (time.Duration, error) {
	env := append(baseEnv(),
		"HARVEST_SHARDS="+strings.Join(f.shardURLs, ","),
		"HARVEST_NATS_URL="+f.ns.URL(),
		"HARVEST_GATEWAY_ADDR="+f.gwAddrs[i],
		"HARVEST_GATEWAY_TOKENS_FILE="+f.tokens,
		// harvest dev's system limit: the benchmark measures the start
		// path, not admission.
		"HARVEST_MAX_RUNS=100000",
	)
	env = append(env, f.cfg.GatewayEnv...)
	began := time.Now()
	p, err := soak.StartProc(fmt.Sprintf("gateway-%d", i), soak.Command{Path: f.cfg.GatewayBin}, env)
	if err != nil {
		return 0, err
	}
	f.gws[i] = p
	took, err := waitReady(ctx, "http://"+f.gwAddrs[i], p, began, time.Minute)
	if err != nil {
		return took, fmt.Errorf("startbench: gateway %d: %w", i, err)
	}
	return took, nil
}

// killGateway SIGKILLs gateway i and waits for it to end.
func (f *fleet) killGateway(i int) {
	p := f.gws[i]
	_ = p.Signal(syscall.SIGKILL)
	<-p.Done()
}

// waitReady polls base's /readyz until it answers 200 and returns the
// time since began.
func waitReady(ctx context.Context, base string, p *soak.Proc, began time.Time, limit time.Duration) (time.Duration, error) {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(began), nil
			}
		}
		if p.Exited() {
			return time.Since(began), fmt.Errorf("exited: %v\n%s", p.ExitError(), p.Log())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(began), fmt.Errorf("not ready after %s\n%s", limit, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog waits until p's output holds line.
func waitLog(ctx context.Context, p *soak.Proc, line string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !strings.Contains(p.Log(), line) {
		if p.Exited() {
			return fmt.Errorf("exited: %v\n%s", p.ExitError(), p.Log())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no %q after %s\n%s", line, limit, p.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (f *fleet) writeTokens() error {
	var list []auth.FileEntry
	for i := range f.cfg.Tenants {
		s, err := auth.NewSecret()
		if err != nil {
			return err
		}
		t := tenantOf(i)
		f.tenants = append(f.tenants, t)
		f.secrets = append(f.secrets, s)
		list = append(list, auth.FileEntry{Name: t, Tenant: t, SHA256: auth.HashSecret(s), Privileges: []string{"runs:start", "runs:read"}})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	f.tokens = filepath.Join(f.dir, "tokens.json")
	return os.WriteFile(f.tokens, b, 0o600)
}

// httpClient returns tenant i's client over HTTP to gateway gw.
func (f *fleet) httpClient(i, gw int, hc *http.Client) (*client.Client, error) {
	return client.New(client.Options{URL: "http://" + f.gwAddrs[gw], Token: f.secrets[i], HTTPClient: hc})
}

// natsClients returns a client of each tenant over a NATS connection of
// its own for each of conns connections: [conn][tenant].
func (f *fleet) natsClients(conns int) ([][]*client.Client, error) {
	var out [][]*client.Client
	for range conns {
		nc, err := natsconn.Connect(f.ns.URL(), natsconn.Options{Name: "harvest-sustain", FailFast: true})
		if err != nil {
			return nil, err
		}
		f.natsConns = append(f.natsConns, nc)
		var row []*client.Client
		for _, t := range f.tenants {
			c, err := client.New(client.Options{NATS: nc, Tenant: t, NATSTimeout: 10 * time.Second})
			if err != nil {
				return nil, err
			}
			row = append(row, c)
		}
		out = append(out, row)
	}
	return out, nil
}

// close stops the processes (gracefully, then by force), NATS, and drops
// the databases.
func (f *fleet) close() error {
	if f.stopVacuum != nil {
		f.stopVacuum()
	}
	for _, nc := range f.natsConns {
		nc.Close()
	}
	stop := func(p *soak.Proc) {
		if p == nil {
			return
		}
		_ = p.Signal(syscall.SIGTERM)
		select {
		case <-p.Done():
		case <-time.After(20 * time.Second):
			p.Stop()
		}
	}
	for _, p := range f.gws {
		stop(p)
	}
	for _, p := range f.workers {
		stop(p)
	}
	if f.ns != nil {
		f.ns.Shutdown()
	}
	for _, p := range f.pools {
		p.Close()
	}
	var errs []error
	for _, d := range f.drops {
		errs = append(errs, d())
	}
	if f.ownDir {
		errs = append(errs, os.RemoveAll(f.dir))
	}
	return errors.Join(errs...)
}

// baseEnv is the environment without any HARVEST_ or OTEL_ variable, so
// the processes see only what the benchmark sets.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "HARVEST_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// loadAvg is the machine's one-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}
