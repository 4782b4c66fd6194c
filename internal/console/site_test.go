package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// The pages are tested through a real gateway, the one implementation of
// the console's Backend: a page's action is only right if the gateway
// checks, audits and applies it as the API would, and that is what these
// tests look at (audit rows, runs cancelled, admission in force). The
// gateway links this package, which only an external test package may
// import it back for.

// Secrets of the console tests' tokens.
const (
	consoleAcme     = "console-acme"     // acme: runs:start, runs:read
	consoleAcmeRead = "console-acme-ro"  // acme: runs:read
	consoleGlobex   = "console-globex"   // globex: runs:start, runs:read
	consoleRoot     = "console-root"     // operator: config:*, weights:*
	consoleOpsRead  = "console-ops-read" // operator: config:read, weights:read
	consoleNobody   = "console-nobody"   // operator without config:read: weights:read
)

// entry is one token of a tokens file.
func entry(name, secret, tenant string, privs ...string) string {
	p, _ := json.Marshal(privs)
	return fmt.Sprintf(`{"name": %q, "sha256": %q, "tenant": %q, "privileges": %s}`, name, auth.HashSecret(secret), tenant, p)
}

func consoleTokens(t *testing.T) *auth.TokenSet {
	t.Helper()
	set, err := auth.ParseTokens([]byte("[" + strings.Join([]string{
		entry("acme-ci", consoleAcme, "acme", "runs:start", "runs:read"),
		entry("acme-ro", consoleAcmeRead, "acme", "runs:read"),
		entry("globex-ci", consoleGlobex, "globex", "runs:start", "runs:read"),
		entry("root", consoleRoot, "", "config:read", "config:write", "weights:read", "weights:write"),
		entry("ops-ro", consoleOpsRead, "", "config:read", "weights:read"),
		entry("nobody", consoleNobody, "", "weights:read"),
	}, ",") + "]"))
	require.NoError(t, err)
	return set
}

// siteOpts shapes a test gateway; zero values give two live shards.
type siteOpts struct {
	// Now is the clock of the console's sessions.
	Now func() time.Time
}

// site is a gateway serving the console, over two fresh shards and NATS.
type site struct {
	ctx    context.Context
	cfg    gateway.Config
	gw     *gateway.Gateway
	srv    *httptest.Server
	tokens *auth.Store
	dbs    []*pgxpool.Pool
}

func serve(t *testing.T, o siteOpts) *site {
	t.Helper()
	s := &site{ctx: context.Background()}
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	for _, u := range urls {
		pool, err := pgxpool.New(s.ctx, u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s.dbs = append(s.dbs, pool)
	}
	natsURL := testsvc.NATSURL(t)
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	s.cfg = gateway.DefaultConfig(urls, natsURL)
	s.cfg.ConnectTimeout = time.Second
	// Small pools: many gateways run at once beside other packages'
	// tests on one server, whose connections are few.
	s.cfg.PoolSize = 3
	s.cfg.Refresh = 20 * time.Millisecond
	require.NoError(t, s.cfg.Validate())
	s.tokens = auth.NewStore(consoleTokens(t))
	s.gw, err = gateway.New(gateway.Options{Config: s.cfg, Tokens: s.tokens, NATS: nc, Now: o.Now,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.srv = httptest.NewServer(s.gw.Handler())
	t.Cleanup(func() {
		s.srv.Close()
		s.gw.Close()
	})
	return s
}

// call sends an API request with a bearer secret ("" for none) and
// returns the status and body.
func (s *site) call(t *testing.T, method, path, secret string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(s.ctx, method, s.srv.URL+path, rd)
	require.NoError(t, err)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := s.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// admission is the admission in force on the gateway (GET /v1/admission
// shows what its watcher holds).
func (s *site) admission(t *testing.T) api.AdmissionView {
	t.Helper()
	status, out := s.call(t, "GET", "/v1/admission", consoleRoot, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	return decode[api.AdmissionView](t, out)
}

func (s *site) count(t *testing.T, shard int, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.dbs[shard].QueryRow(s.ctx, query, args...).Scan(&n))
	return n
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(data, &v), string(data))
	return v
}

// startRun starts a run through the HTTP API with a tenant's token.
func startRun(t *testing.T, s *site, secret, queue string) api.Run {
	t.Helper()
	status, out := s.call(t, "POST", "/v1/runs", secret, map[string]any{"name": "echo", "queue": queue, "input": map[string]int{"n": 1}})
	require.Equal(t, http.StatusCreated, status, string(out))
	return decode[api.Run](t, out)
}

// fakeClock is a settable clock for session expiry.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// browser is an HTTP client with cookies that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (br *browser) get(path string) (int, string) {
	status, _, body := br.getWithLocation(path)
	return status, body
}

// getWithLocation is get that also returns the Location header.
func (br *browser) getWithLocation(path string) (int, string, string) {
	resp, err := br.hc.Get(br.base + path)
	require.NoError(br.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(br.t, err)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

func (br *browser) post(path string, form url.Values) (int, string, string) {
	resp, err := br.hc.PostForm(br.base+path, form)
	require.NoError(br.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(br.t, err)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	require.NotNil(t, m, page)
	return m[1]
}

// signIn signs a fresh browser in with secret and returns it with the
// redirect of the sign-in.
func signIn(t *testing.T, s *site, secret string) (*browser, string) {
	t.Helper()
	br := newBrowser(t, s.srv.URL)
	_, page := br.get("/admin")
	status, loc, page := br.post("/admin/login", url.Values{"token": {secret}, "csrf": {csrfOf(t, page)}})
	require.Equal(t, http.StatusSeeOther, status, page)
	return br, loc
}
