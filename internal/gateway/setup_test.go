package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// metricReader collects the metrics of every gateway in the tests.
var metricReader = sdkmetric.NewManualReader()

func TestMain(m *testing.M) {
	// Real spans (not exported), so the stored trace context can be checked.
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(metricReader)))
	testsvc.Main(m)
}

// Two tenants whose home shards differ among two shards.
var tenantOn = func() [2]string {
	var out [2]string
	for _, name := range []string{"acme", "globex", "initech", "umbrella", "hooli", "wayne", "stark", "tyrell"} {
		h := shards.Home(name, 2)
		if out[h] == "" {
			out[h] = name
		}
	}
	return out
}()

// Secrets of the test tokens.
const (
	secretA      = "secret-a"       // tenantOn[0]: runs:start, runs:read
	secretB      = "secret-b"       // tenantOn[1]: runs:start, runs:read
	secretAReads = "secret-a-reads" // tenantOn[0]: runs:read
	secretAdmin  = "secret-admin"   // no tenant
	secretRoot   = "secret-root"    // no tenant: weights:*, config:*
	secretWRead  = "secret-wread"   // no tenant: weights:read
	secretAOps   = "secret-a-ops"   // tenantOn[0]: weights:read, weights:write
)

// entry is one token of a tokens file.
func entry(name, secret, tenant string, privs ...string) string {
	p, _ := json.Marshal(privs)
	return fmt.Sprintf(`{"name": %q, "sha256": %q, "tenant": %q, "privileges": %s}`, name, auth.HashSecret(secret), tenant, p)
}

func testTokens(t *testing.T) *auth.TokenSet {
	t.Helper()
	set, err := auth.ParseTokens([]byte("[" + strings.Join([]string{
		entry("a-ci", secretA, tenantOn[0], "runs:start", "runs:read"),
		entry("b-ci", secretB, tenantOn[1], "runs:start", "runs:read"),
		entry("a-reader", secretAReads, tenantOn[0], "runs:read"),
		entry("ops", secretAdmin, "", "runs:read", "config:read"),
		entry("root", secretRoot, "", "weights:read", "weights:write", "config:read", "config:write"),
		entry("wread", secretWRead, "", "weights:read"),
		entry("a-ops", secretAOps, tenantOn[0], "weights:read", "weights:write"),
	}, ",") + "]"))
	require.NoError(t, err)
	return set
}

// setupOpts shapes a test gateway; zero values give two live shards.
type setupOpts struct {
	DeadShard1   bool // shard 1 points at a port where nothing listens
	KeyBinding   bool
	MaxBodyBytes int64
	Authorizer   Authorizer
	Admitter     tenantcap.Hook
	// MaxRuns raises the system limit (HARVEST_MAX_RUNS) when set.
	MaxRuns int
	// Refresh replaces the tests' 20ms HARVEST_ADMISSION_REFRESH.
	Refresh time.Duration
	// Reload replaces the default HARVEST_ADMISSION_RELOAD.
	Reload time.Duration
	// Tokens replaces the test tokens.
	Tokens *auth.TokenSet
	// Now is the clock of the /admin sessions.
	Now func() time.Time
	// Shards and NATSURL reuse another bundle's servers (two gateways).
	Shards  []string
	NATSURL string
	// Tune, when set, changes the configuration last, before New.
	Tune func(*Config)
}

type bundle struct {
	ctx     context.Context
	gw      *Gateway
	srv     *httptest.Server
	nc      *nats.Conn
	urls    []string
	dbs     []*pgxpool.Pool // direct pools for checks (nil for a dead shard)
	tokens  *auth.Store
	natsURL string
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	b := &bundle{ctx: context.Background(), urls: o.Shards, natsURL: o.NATSURL}
	if b.urls == nil {
		b.urls = []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
		if o.DeadShard1 {
			b.urls[1] = "postgres://postgres@127.0.0.1:1/none?sslmode=disable"
		}
	}
	for _, u := range b.urls {
		if strings.Contains(u, ":1/none") {
			b.dbs = append(b.dbs, nil)
			continue
		}
		pool, err := pgxpool.New(b.ctx, u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		b.dbs = append(b.dbs, pool)
	}
	if b.natsURL == "" {
		b.natsURL = testsvc.NATSURL(t)
	}
	nc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	b.nc = nc

	cfg := DefaultConfig(b.urls, b.natsURL)
	cfg.KeyBinding = o.KeyBinding
	cfg.WaitPoll = 20 * time.Millisecond
	// Most tests finish runs straight in the database, with no run event:
	// their waits end by rereading.
	cfg.WaitFallback = 20 * time.Millisecond
	// The shipped connect timeout: a shard that is down refuses at once
	// (the tests' dead shards are closed ports), while a backend's
	// start-up on a server loaded by the whole suite under the race
	// detector once took over a second, and a start answered 503.
	cfg.ConnectTimeout = DefaultConfig(nil, "").ConnectTimeout
	// Small pools: the package runs dozens of gateways at once beside
	// other packages' tests on one server, whose connections are few.
	cfg.PoolSize = 3
	if o.MaxBodyBytes > 0 {
		cfg.MaxBodyBytes = o.MaxBodyBytes
	}
	if o.MaxRuns > 0 {
		cfg.MaxRuns = o.MaxRuns
	}
	cfg.Refresh = 20 * time.Millisecond
	if o.Reload > 0 {
		cfg.Reload = o.Reload
	}
	if o.Refresh > 0 {
		cfg.Refresh = o.Refresh
	}
	if o.Tune != nil {
		o.Tune(&cfg)
	}
	require.NoError(t, cfg.Validate())
	set := o.Tokens
	if set == nil {
		set = testTokens(t)
	}
	b.tokens = auth.NewStore(set)
	gw, err := New(Options{Config: cfg, Tokens: b.tokens, NATS: nc, Authorizer: o.Authorizer, Admitter: o.Admitter, Now: o.Now,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# metrics\n") })})
	require.NoError(t, err)
	require.NoError(t, gw.ServeNATS())
	b.gw = gw
	b.srv = httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		b.srv.Close()
		gw.Close()
	})
	return b
}

// call sends an HTTP request with a bearer secret ("" for none) and returns
// the status and body.
func (b *bundle) call(t *testing.T, method, path, secret string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(b.ctx, method, b.srv.URL+path, rd)
	require.NoError(t, err)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// natsCall sends a NATS request on subject and returns the status header
// and body.
func (b *bundle) natsCall(t *testing.T, subject string, body string) (int, []byte) {
	t.Helper()
	// The answer comes only to the tenant's own inbox, as a tenant's
	// client sets it up (natsauth.InboxPrefix).
	msg, err := b.tenantNATS(t, subject[strings.LastIndexByte(subject, '.')+1:]).Request(subject, []byte(body), 10*time.Second)
	require.NoError(t, err)
	var status int
	_, err = fmt.Sscan(msg.Header.Get(StatusHeader), &status)
	require.NoError(t, err)
	return status, msg.Data
}

func (b *bundle) client(t *testing.T, secret string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: b.srv.URL, Token: secret})
	require.NoError(t, err)
	return c
}

// tenantNATS is a connection with the tenant's inbox prefix.
func (b *bundle) tenantNATS(t *testing.T, tenant string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(b.natsURL, nats.CustomInboxPrefix(natsauth.InboxPrefix(tenant)))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func (b *bundle) natsClient(t *testing.T, tenant string) *client.Client {
	t.Helper()
	// The shared connection's inbox is not the tenant's: the client then
	// takes its answers under the tenant's inbox itself.
	c, err := client.New(client.Options{NATS: b.nc, Tenant: tenant})
	require.NoError(t, err)
	return c
}

func (b *bundle) count(t *testing.T, shard int, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.dbs[shard].QueryRow(b.ctx, query, args...).Scan(&n))
	return n
}

// nothingWritten checks that both shards hold no run, task or count.
func (b *bundle) nothingWritten(t *testing.T, what string) {
	t.Helper()
	for i, db := range b.dbs {
		if db == nil {
			continue
		}
		require.Zero(t, b.count(t, i, `SELECT count(*) FROM runs`), what)
		require.Zero(t, b.count(t, i, `SELECT count(*) FROM tasks`), what)
		require.Zero(t, b.count(t, i, `SELECT coalesce(sum(running), 0) FROM tenant_running`), what)
		require.Zero(t, b.count(t, i, `SELECT count(*) FROM fair_state`), what)
	}
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(data, &v), string(data))
	return v
}

func apiErr(t *testing.T, data []byte) *api.Error {
	t.Helper()
	eb := decode[api.ErrorBody](t, data)
	require.NotNil(t, eb.Error, string(data))
	return eb.Error
}

func startBody(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"name":"echo","queue":"shared","input":{"n":1}` + extra + `}`
}

// home is the tenant's home shard as the gateway's directory has it
// (placing the tenant when it is new, as a start would).
func (g *Gateway) home(tenant string) int {
	e, err := g.dir.Home(context.Background(), tenant)
	if err != nil {
		panic(err)
	}
	return e.Shard
}
