package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// Queue is the one queue the fleet's workers serve and the load uses.
const Queue = "q"

// Trickle names the quota key (and, with "-key", the fairness key) of the
// runs whose quota lets one claim through and then refuses every other
// claim for minutes: they make the claim's post-claim recheck refuse rows
// all the time, so the check can tell whether a refusal charged the key.
const (
	TrickleQuota = "trickle"
	TrickleKey   = "trickle-key"
)

// AppName is the application_name of the harness's own Postgres
// connections; fault injection leaves them alone.
const AppName = "harvest-soak"

// Options configure a Fleet.
type Options struct {
	Bins Binaries
	// ShardURLs are the direct URLs of the shard databases, in shard
	// order. The binaries reach them through the fleet's proxies.
	ShardURLs []string
	// Gateways is the number of gateway processes (default 2).
	Gateways int
	// WorkersPerShard is the number of worker processes per shard
	// (default 2).
	WorkersPerShard int
	// NoWorkers starts no worker at all, so that runs stay unfinished
	// (admission tests).
	NoWorkers bool
	// MaxRuns is the gateways' system limit, HARVEST_MAX_RUNS (default
	// 1,000,000: no limit in practice).
	MaxRuns int
	// Tenants are the tenants the load starts runs for (default acme,
	// globex, initech).
	Tenants []string
	// Dir holds the tokens file.
	Dir string
	// Logf receives progress lines (nil: none).
	Logf func(format string, args ...any)
	// Lease is the workers' lease (default 1s); the heartbeat is a quarter
	// of it.
	Lease time.Duration
	// JanitorInterval is the workers' janitor interval (default 200ms).
	JanitorInterval time.Duration
	// Slots is each worker's HARVEST_WORKER_MAX_CONCURRENT_CLAIMS, the
	// tasks it runs at once (default 2: the fault tests want few tasks in
	// flight so that each fault hits a known one; the soak at a working
	// rate sets more).
	Slots int
	// GatewayPool is each gateway's HARVEST_GATEWAY_POOL_SIZE (default 4,
	// so that the fault tests fit a test server's connection limit).
	GatewayPool int
	// Shipped runs the gateways and workers on their shipped defaults: the
	// fleet sets only what it must (fleetenv.go's required settings), and
	// Lease, JanitorInterval, Slots and GatewayPool are not used.
	Shipped bool
	// NATSURL, when set, is the NATS the fleet uses (one URL or a
	// cluster's comma-separated list, as HARVEST_NATS_URL takes them)
	// instead of a server of its own; StopNATS and StartNATS are then the
	// caller's business.
	NATSURL string
	// Unproxied has the binaries reach the shards at ShardURLs as given,
	// not through the fleet's proxies, so that a URL may name a primary and
	// its standby (the failover tests). The proxy faults (ShardOutage,
	// FlakyShard, WeightsDuringOutage, Proxy) are then unavailable.
	Unproxied bool
}

// Fleet is a running set of processes and the harness around them.
type Fleet struct {
	opts Options

	natsMu   sync.Mutex
	nats     *natsembed.Server
	natsPort int
	natsURL  string

	proxies []*Proxy
	direct  []*pgxpool.Pool
	proxied []string

	tokensFile  string
	secrets     map[string]string // tenant -> secret
	adminSecret string
	gwAddrs     []string
	hc          *http.Client

	mu       sync.Mutex
	gateways []*Proc
	workers  map[string]*Proc
	wShard   map[string]int
	retired  []*Proc // processes killed on purpose (their logs are kept)
	nextW    int

	obs      *nats.Conn
	obsSubs  []*nats.Subscription
	evMu     sync.Mutex
	events   map[string][]api.Status // tenant/run id -> final statuses heard
	probeRun map[string]int          // tenant/run id -> probe executions
	probeWG  sync.WaitGroup
	probeCtx context.Context
	probeEnd context.CancelFunc

	clock *clockSampler
	// monitor, when set (under evMu), hears the watched probe executions.
	monitor *Monitor
}

func (o *Options) defaults() {
	if o.Gateways <= 0 {
		o.Gateways = 2
	}
	if o.WorkersPerShard <= 0 {
		o.WorkersPerShard = 2
	}
	if o.NoWorkers {
		o.WorkersPerShard = 0
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = 1_000_000
	}
	if len(o.Tenants) == 0 {
		o.Tenants = []string{"acme", "globex", "initech"}
	}
	if o.Lease <= 0 {
		o.Lease = time.Second
	}
	if o.JanitorInterval <= 0 {
		o.JanitorInterval = 200 * time.Millisecond
	}
	if o.Slots <= 0 {
		o.Slots = 2
	}
	if o.GatewayPool <= 0 {
		o.GatewayPool = 4
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// Start brings the fleet up: NATS, the proxies, the gateways (ready), the
// workers, the observers (run events, probe handler, clock sampler) and the
// trickle quota. On error, what was started is stopped.
func Start(ctx context.Context, opts Options) (f *Fleet, err error) {
	opts.defaults()
	if len(opts.ShardURLs) == 0 {
		return nil, errors.New("soak: no shards")
	}
	f = &Fleet{opts: opts, workers: map[string]*Proc{}, wShard: map[string]int{},
		events: map[string][]api.Status{}, probeRun: map[string]int{}, secrets: map[string]string{},
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	f.probeCtx, f.probeEnd = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			f.Close()
			f = nil
		}
	}()
	if opts.NATSURL != "" {
		f.natsURL = opts.NATSURL
	} else if err := f.startNATS(0); err != nil {
		return f, err
	}
	for i, raw := range opts.ShardURLs {
		u, err := url.Parse(raw)
		if err != nil {
			return f, fmt.Errorf("soak: shard %d: %w", i, err)
		}
		if opts.Unproxied {
			// The binaries dial the URL as given; pgx tries its hosts.
			f.proxies = append(f.proxies, nil)
			f.proxied = append(f.proxied, raw)
		} else {
			host := u.Host
			if u.Port() == "" {
				host = net.JoinHostPort(u.Hostname(), "5432")
			}
			p, err := NewProxy(host)
			if err != nil {
				return f, err
			}
			f.proxies = append(f.proxies, p)
			pu := *u
			pu.Host = p.Addr()
			f.proxied = append(f.proxied, pu.String())
		}
		pc, err := pgxpool.ParseConfig(raw)
		if err != nil {
			return f, err
		}
		pc.ConnConfig.RuntimeParams["application_name"] = AppName
		pc.MaxConns = 3
		// As the binaries' pools do, the harness's follows the shard's
		// primary when a URL names several hosts.
		pool, err := pgpool.New(ctx, i, "", pc)
		if err != nil {
			return f, err
		}
		f.direct = append(f.direct, pool)
	}
	if err := f.writeTokens(); err != nil {
		return f, err
	}
	for range opts.Gateways {
		addr, err := freeAddr()
		if err != nil {
			return f, err
		}
		f.gwAddrs = append(f.gwAddrs, addr)
		f.gateways = append(f.gateways, nil)
	}
	for i := range f.gwAddrs {
		if err := f.StartGateway(ctx, i); err != nil {
			return f, err
		}
	}
	for s := range f.direct {
		for range opts.WorkersPerShard {
			if _, err := f.AddWorker(s); err != nil {
				return f, err
			}
		}
	}
	if err := f.observe(); err != nil {
		return f, err
	}
	rate, burst := 0.01, 1.0
	res, err := f.Admin(0).SetQuota(ctx, Queue, TrickleQuota, api.Quota{Rate: &rate, Burst: &burst})
	if err != nil {
		return f, fmt.Errorf("soak: set the trickle quota: %w", err)
	}
	if res.Status() != http.StatusOK {
		return f, fmt.Errorf("soak: set the trickle quota: status %d: %+v", res.Status(), res.Shards)
	}
	f.clock = startClock(f.direct)
	opts.Logf("fleet up: %d shards, %d gateways, %d workers, NATS %s", len(f.direct), len(f.gwAddrs), len(f.workers), f.natsURL)
	return f, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (f *Fleet) startNATS(port int) error {
	var s *natsembed.Server
	var err error
	// The port of a server just stopped may take a moment to be free.
	for try := 0; try < 50; try++ {
		s, err = natsembed.Start(natsembed.Options{Port: port, Dir: f.opts.Dir})
		if err == nil || port == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	u, _ := url.Parse(s.URL())
	p, _ := strconv.Atoi(u.Port())
	f.natsMu.Lock()
	f.nats, f.natsPort, f.natsURL = s, p, s.URL()
	f.natsMu.Unlock()
	return nil
}

// StopNATS shuts the NATS server down; StartNATS starts a new one on the
// same port. Every client of the fleet reconnects by itself.
func (f *Fleet) StopNATS() {
	f.natsMu.Lock()
	s := f.nats
	f.natsMu.Unlock()
	if s == nil {
		return // Options.NATSURL: not the fleet's server
	}
	s.Shutdown()
}

// StartNATS starts the NATS server again on its port.
func (f *Fleet) StartNATS() error { return f.startNATS(f.natsPort) }

// NATSURL is the fleet's NATS address.
func (f *Fleet) NATSURL() string { return f.natsURL }

func (f *Fleet) writeTokens() error {
	var list []auth.FileEntry
	for _, t := range f.opts.Tenants {
		s, err := auth.NewSecret()
		if err != nil {
			return err
		}
		f.secrets[t] = s
		list = append(list, auth.FileEntry{Name: t + "-load", Tenant: t, SHA256: auth.HashSecret(s), Privileges: []string{"runs:start", "runs:read"}})
	}
	s, err := auth.NewSecret()
	if err != nil {
		return err
	}
	f.adminSecret = s
	list = append(list, auth.FileEntry{Name: "soak-admin", SHA256: auth.HashSecret(s),
		Privileges: []string{"weights:read", "weights:write", "config:read", "config:write"}})
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	f.tokensFile = filepath.Join(f.opts.Dir, "tokens.json")
	return os.WriteFile(f.tokensFile, b, 0o600)
}

// baseEnv is the environment without any HARVEST_ or OTEL_ variable of the
// caller, so the processes see only what the fleet sets.
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

func (f *Fleet) commonEnv() []string {
	return append(baseEnv(),
		"HARVEST_SHARDS="+strings.Join(f.proxied, ","),
		"HARVEST_NATS_URL="+f.natsURL,
	)
}

// StartGateway starts gateway i (again) on its address and waits until it
// is ready.
func (f *Fleet) StartGateway(ctx context.Context, i int) error {
	// What every gateway needs, then the fault tuning (fleetenv.go).
	env := append(f.commonEnv(), envOf(f.gatewayRequired(i), f.opts.gatewayTuning())...)
	p, err := startProc(fmt.Sprintf("gateway-%d", i), f.opts.Bins.Gateway, env)
	if err != nil {
		return err
	}
	f.mu.Lock()
	if old := f.gateways[i]; old != nil {
		f.retired = append(f.retired, old)
	}
	f.gateways[i] = p
	f.mu.Unlock()
	return f.waitReady(ctx, i, p)
}

func (f *Fleet) waitReady(ctx context.Context, i int, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.GatewayURL(i)+"/readyz", nil)
		if resp, err := f.hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.Done():
			return fmt.Errorf("soak: gateway %d exited: %v\n%s", i, p.ExitError(), p.Log())
		case <-ctx.Done():
			return fmt.Errorf("soak: gateway %d not ready: %w\n%s", i, ctx.Err(), p.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KillGateway SIGKILLs gateway i and waits for it to exit.
func (f *Fleet) KillGateway(i int) {
	f.mu.Lock()
	p := f.gateways[i]
	f.mu.Unlock()
	_ = p.Signal(syscall.SIGKILL)
	<-p.Done()
}

// GatewayURL is gateway i's base URL.
func (f *Fleet) GatewayURL(i int) string { return "http://" + f.gwAddrs[i] }

// Gateways is the number of gateways.
func (f *Fleet) Gateways() int { return len(f.gwAddrs) }

// Shards is the number of shards.
func (f *Fleet) Shards() int { return len(f.direct) }

// Direct is a pool straight to shard s (not through its proxy).
func (f *Fleet) Direct(s int) *pgxpool.Pool { return f.direct[s] }

// ShardURLs are the shards' direct URLs, in shard order (for tools run
// beside the fleet, such as the harvest command).
func (f *Fleet) ShardURLs() []string { return f.opts.ShardURLs }

// MaxRuns is the gateways' system limit.
func (f *Fleet) MaxRuns() int { return f.opts.MaxRuns }

// Proxy is the proxy in front of shard s.
func (f *Fleet) Proxy(s int) *Proxy { return f.proxies[s] }

// Tenants are the load's tenants.
func (f *Fleet) Tenants() []string { return f.opts.Tenants }

// HTTPClient is the harness's HTTP client.
func (f *Fleet) HTTPClient() *http.Client { return f.hc }

// Tenant returns a client for tenant over HTTP to gateway gw.
func (f *Fleet) Tenant(tenant string, gw int) *client.Client {
	c, err := client.New(client.Options{URL: f.GatewayURL(gw), Token: f.secrets[tenant], HTTPClient: f.hc})
	if err != nil {
		panic(err)
	}
	return c
}

// Secret is tenant's bearer secret ("" for an unknown tenant).
func (f *Fleet) Secret(tenant string) string { return f.secrets[tenant] }

// Admin returns a client with the administrator token on gateway gw.
func (f *Fleet) Admin(gw int) *client.Client {
	c, err := client.New(client.Options{URL: f.GatewayURL(gw), Token: f.adminSecret, HTTPClient: f.hc})
	if err != nil {
		panic(err)
	}
	return c
}

// AddWorker starts a new worker process on shard s and returns its id.
func (f *Fleet) AddWorker(s int) (string, error) {
	f.mu.Lock()
	id := fmt.Sprintf("w%d-%d", s, f.nextW)
	f.nextW++
	f.mu.Unlock()
	// What every worker needs, then the fault tuning (fleetenv.go).
	env := append(f.commonEnv(), envOf(f.workerRequired(s, id), f.opts.workerTuning())...)
	p, err := startProc(id, f.opts.Bins.Worker, env)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	f.workers[id] = p
	f.wShard[id] = s
	f.mu.Unlock()
	return id, nil
}

// Worker returns the process of worker id (nil when unknown).
func (f *Fleet) Worker(id string) *Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.workers[id]
}

// Workers returns the ids of the live workers of shard s (all shards when
// s < 0), sorted.
func (f *Fleet) Workers(s int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id, p := range f.workers {
		if !p.Exited() && (s < 0 || f.wShard[id] == s) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// RetireWorker forgets worker id after it was killed (its log is kept).
func (f *Fleet) RetireWorker(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.workers[id]; p != nil {
		f.retired = append(f.retired, p)
		delete(f.workers, id)
	}
}

// Procs returns every process the fleet started, live or not.
func (f *Fleet) Procs() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Proc
	for _, p := range f.gateways {
		if p != nil {
			out = append(out, p)
		}
	}
	ids := make([]string, 0, len(f.workers))
	for id := range f.workers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		out = append(out, f.workers[id])
	}
	return append(out, f.retired...)
}

// Logs returns the tail of every process's output, for a failed test.
func (f *Fleet) Logs() string {
	var b strings.Builder
	for _, p := range f.Procs() {
		fmt.Fprintf(&b, "==== %s (pid %d)\n%s\n", p.Name, p.Pid(), p.Log())
	}
	return b.String()
}

// observe subscribes the harness to run events and serves the probe
// workflow over the worker's NATS bridge.
func (f *Fleet) observe() error {
	nc, err := natsconn.Connect(f.natsURL, natsconn.Options{Name: "harvest-soak"})
	if err != nil {
		return err
	}
	f.obs = nc
	sub, err := nc.Subscribe("harvest.runs.>", func(m *nats.Msg) {
		var run api.Run
		if json.Unmarshal(m.Data, &run) != nil || !run.Status.Final() {
			return
		}
		f.evMu.Lock()
		k := run.Tenant + "/" + run.ID
		f.events[k] = append(f.events[k], run.Status)
		f.evMu.Unlock()
	})
	if err != nil {
		return err
	}
	f.obsSubs = append(f.obsSubs, sub)
	sub, err = nc.QueueSubscribe("harvest.handle.probe", "soak-probe", f.probe)
	if err != nil {
		return err
	}
	f.obsSubs = append(f.obsSubs, sub)
	return nc.Flush()
}

// ProbeOutput is the output of a probe run: the attempt that produced it.
type ProbeOutput struct {
	Attempt int   `json:"attempt"`
	Task    int64 `json:"task"`
}

// probe runs the probe workflow: wait the input's ms, then complete with
// the attempt number, so the check can tell which attempt's completion was
// applied.
func (f *Fleet) probe(m *nats.Msg) {
	var req workerbin.BridgeRequest
	if json.Unmarshal(m.Data, &req) != nil {
		return
	}
	var in struct {
		MS  int    `json:"ms"`
		Key string `json:"key"`
	}
	_ = json.Unmarshal(req.Input, &in)
	run := req.Tenant + "/" + req.RunID
	f.evMu.Lock()
	f.probeRun[run]++
	mon := f.monitor
	f.evMu.Unlock()
	if mon != nil && in.Key != "" {
		mon.executed(in.Key, run, req.Attempt)
	}
	f.probeWG.Add(1)
	go func() {
		defer f.probeWG.Done()
		select {
		case <-time.After(time.Duration(in.MS) * time.Millisecond):
		case <-f.probeCtx.Done():
			return
		}
		out, _ := json.Marshal(ProbeOutput{Attempt: req.Attempt, Task: req.TaskID})
		body, _ := json.Marshal(workerbin.BridgeReply{Output: out})
		_ = m.Respond(body)
	}()
}

// RSS returns the resident memory of every live process, by name.
func (f *Fleet) RSS() map[string]int64 {
	out := map[string]int64{"harness": rssOf(os.Getpid())}
	for _, p := range f.Procs() {
		if !p.Exited() {
			out[p.Name] = p.RSS()
		}
	}
	return out
}

// Close stops every process (SIGTERM, then SIGKILL after a few seconds),
// the observers, NATS, the proxies and the pools.
func (f *Fleet) Close() {
	if f.clock != nil {
		f.clock.stop()
	}
	procs := f.Procs()
	for _, p := range procs {
		_ = p.Signal(syscall.SIGCONT)
		_ = p.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range procs {
		t := time.NewTimer(max(time.Until(deadline), 0))
		select {
		case <-p.Done():
		case <-t.C:
		}
		t.Stop()
		p.Stop() // SIGKILL what did not stop in time
	}
	if f.probeEnd != nil {
		f.probeEnd()
	}
	for _, s := range f.obsSubs {
		_ = s.Unsubscribe()
	}
	if f.obs != nil {
		f.obs.Close()
	}
	f.probeWG.Wait()
	f.natsMu.Lock()
	s := f.nats
	f.natsMu.Unlock()
	if s != nil {
		s.Shutdown()
	}
	for _, p := range f.proxies {
		if p != nil { // nil: Options.Unproxied
			p.Close()
		}
	}
	for _, p := range f.direct {
		p.Close()
	}
	if t, ok := f.hc.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}
