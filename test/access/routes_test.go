package access

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// Passwords of the users of deploy/nats/nats.conf, read by the server from
// the environment when it loads the file.
var passwords = map[string]string{
	"HARVEST_NATS_PASSWORD":          "svcpw",
	"HARVEST_NATS_HANDLERS_PASSWORD": "handlerspw",
	"HARVEST_NATS_ACME_PASSWORD":     "acmepw",
	"HARVEST_NATS_GLOBEX_PASSWORD":   "globexpw",
	"HARVEST_NATS_INITECH_PASSWORD":  "initechpw",
	// The file makes the server a node of a cluster; here it is alone.
	"HARVEST_NATS_ROUTE_PASSWORD": "routepw",
	"HARVEST_NATS_ROUTES":         "[]",
}

func TestMain(m *testing.M) {
	for k, v := range passwords {
		os.Setenv(k, v)
	}
	testsvc.Main(m)
}

// token is one caller of the table: its secret ("" sends no header) and
// what it holds.
type token struct {
	name   string
	header string // Authorization header; "" for none
	tenant string // "" for an administrator or no token
	privs  []auth.Privilege
	known  bool
}

var tenantPrivs = []auth.Privilege{auth.RunsStart, auth.RunsRead, auth.WeightsRead, auth.WeightsWrite}

// tokens are the callers: none, a malformed header, an unknown token,
// tenant acme with each privilege alone and with all a tenant may hold,
// administrators with each privilege alone and with all, and tenant globex
// with everything (the other tenant).
func tokens() []token {
	out := []token{
		{name: "missing"},
		{name: "malformed", header: "Basic YWNtZTpwdw=="},
		{name: "unknown", header: "Bearer not-a-known-secret"},
	}
	for _, p := range tenantPrivs {
		out = append(out, token{name: "acme " + string(p), tenant: "acme", privs: []auth.Privilege{p}, known: true})
	}
	out = append(out, token{name: "acme all", tenant: "acme", privs: tenantPrivs, known: true})
	for _, p := range auth.AllPrivileges() {
		out = append(out, token{name: "admin " + string(p), privs: []auth.Privilege{p}, known: true})
	}
	out = append(out, token{name: "admin all", privs: auth.AllPrivileges(), known: true})
	out = append(out, token{name: "globex all", tenant: "globex", privs: tenantPrivs, known: true})
	for i := range out {
		if out[i].known {
			out[i].header = "Bearer secret-" + tokenName(out[i].name)
		}
	}
	return out
}

func tokensFile(t *testing.T, list []token) *auth.Store {
	t.Helper()
	var entries []string
	for _, tk := range list {
		if !tk.known {
			continue
		}
		privs := make([]string, len(tk.privs))
		for i, p := range tk.privs {
			privs[i] = string(p)
		}
		b, _ := json.Marshal(privs)
		entries = append(entries, fmt.Sprintf(`{"name":%q,"tenant":%q,"sha256":%q,"privileges":%s}`,
			tokenName(tk.name), tk.tenant,
			auth.HashSecret(strings.TrimPrefix(tk.header, "Bearer ")), b))
	}
	set, err := auth.ParseTokens([]byte("[" + strings.Join(entries, ",") + "]"))
	require.NoError(t, err)
	return auth.NewStore(set)
}

// route is one route of the API: the privilege it needs (none for the
// operations routes), whether it acts on the caller's tenant (run routes:
// administrator tokens are refused there), and the status an allowed
// caller gets.
type route struct {
	method, path, body string
	priv               auth.Privilege // "" : no token needed
	tenantOnly         bool
	ok                 int
	// otherTenant is the status for globex on acme's resources (0: same as ok).
	otherTenant int
	// tenantToken is the status for a tenant's token that has the
	// privilege (0: same as ok): a tenant writes only its own keys.
	tenantToken int
}

// newGateway runs an in-process gateway on two fresh shards.
func newGateway(t *testing.T, store *auth.Store) *httptest.Server {
	t.Helper()
	cfg := gateway.DefaultConfig([]string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}, "")
	cfg.MaxRuns = 1_000_000
	g, err := gateway.New(gateway.Options{Config: cfg, Tokens: store,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# metrics\n") })})
	require.NoError(t, err)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() { srv.Close(); g.Close() })
	return srv
}

func do(t *testing.T, srv *httptest.Server, method, path, body, header string) (int, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, srv.URL+path, r)
	require.NoError(t, err)
	if header != "" {
		req.Header.Set("Authorization", header)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEveryRouteEveryPrivilege calls every route with every caller and
// requires exactly the answer the privilege rules give: 401 without a
// known token, 403 without the privilege (or with an administrator token
// on a tenant's run routes), the route's own answer otherwise; another
// tenant's runs are not found (404), never shown or cancelled.
func TestEveryRouteEveryPrivilege(t *testing.T) {
	list := tokens()
	srv := newGateway(t, tokensFile(t, list))
	acmeAll := list[len(tenantPrivs)+3].header // "acme all"
	require.Contains(t, acmeAll, "acme-all")

	// acme's runs that the table reads and cancels.
	status, body := do(t, srv, "POST", "/v1/runs", `{"id":"acme-run","name":"echo","queue":"q"}`, acmeAll)
	require.Equal(t, 201, status, body)

	routes := []route{
		{method: "POST", path: "/v1/runs", body: `{"id":"r-%s","name":"echo","queue":"q"}`, priv: auth.RunsStart, tenantOnly: true, ok: 201},
		{method: "POST", path: "/v1/runs/batch", body: `{"runs":[{"id":"b-%s","name":"echo","queue":"q"}]}`, priv: auth.RunsStart, tenantOnly: true, ok: 200},
		{method: "GET", path: "/v1/runs", priv: auth.RunsRead, tenantOnly: true, ok: 200},
		{method: "GET", path: "/v1/runs/acme-run", priv: auth.RunsRead, tenantOnly: true, ok: 200, otherTenant: 404},
		{method: "POST", path: "/v1/runs/acme-run/cancel", priv: auth.RunsStart, tenantOnly: true, ok: 200, otherTenant: 404},
		{method: "GET", path: "/v1/usage", priv: auth.RunsRead, tenantOnly: true, ok: 200},
		{method: "GET", path: "/v1/queues/q/weights", priv: auth.WeightsRead, ok: 200},
		{method: "PUT", path: "/v1/queues/q/weights/k", body: `{"weight":2}`, priv: auth.WeightsWrite, ok: 200, tenantToken: 403},
		{method: "DELETE", path: "/v1/queues/q/weights/k", priv: auth.WeightsWrite, ok: 200, tenantToken: 403},
		{method: "PUT", path: "/v1/queues/q/weights/acme%2Fk", body: `{"weight":2}`, priv: auth.WeightsWrite, ok: 200, otherTenant: 403},
		{method: "DELETE", path: "/v1/queues/q/weights/acme", priv: auth.WeightsWrite, ok: 200, otherTenant: 403},
		{method: "GET", path: "/v1/queues/q/quotas", priv: auth.WeightsRead, ok: 200},
		{method: "PUT", path: "/v1/queues/q/quotas/qk", body: `{"max_concurrent":5}`, priv: auth.WeightsWrite, ok: 200, tenantToken: 403},
		{method: "GET", path: "/v1/queues/q/quotas/qk", priv: auth.WeightsRead, ok: 200},
		{method: "DELETE", path: "/v1/queues/q/quotas/qk", priv: auth.WeightsWrite, ok: 200, tenantToken: 403},
		{method: "PUT", path: "/v1/queues/q/quotas/acme%2Fqk", body: `{"max_concurrent":5}`, priv: auth.WeightsWrite, ok: 200, otherTenant: 403},
		{method: "GET", path: "/v1/queues/q/keys", priv: auth.WeightsRead, ok: 200},
		{method: "GET", path: "/v1/audit", priv: auth.ConfigRead, ok: 200},
		{method: "GET", path: "/v1/admission", priv: auth.ConfigRead, ok: 200},
		{method: "PUT", path: "/v1/admission", body: `{"algorithm":"no_limit"}`, priv: auth.ConfigWrite, ok: 200},
		{method: "GET", path: "/healthz", ok: 200},
		{method: "GET", path: "/readyz", ok: 200},
		{method: "GET", path: "/metrics", ok: 200},
	}
	for ri, rt := range routes {
		for ti, tk := range list {
			t.Run(fmt.Sprintf("%s %s/%s", rt.method, rt.path, tk.name), func(t *testing.T) {
				want := rt.ok
				switch {
				case rt.priv == "":
				case !tk.known:
					want = 401
				case !hasPriv(tk, rt.priv):
					want = 403
				case rt.tenantOnly && tk.tenant == "":
					want = 403
				case tk.tenant == "globex" && rt.otherTenant != 0:
					want = rt.otherTenant
				case tk.tenant != "" && rt.tenantToken != 0:
					want = rt.tenantToken
				}
				b := rt.body
				if strings.Contains(b, "%s") {
					b = fmt.Sprintf(b, fmt.Sprintf("%d-%d", ri, ti))
				}
				status, body := do(t, srv, rt.method, rt.path, b, tk.header)
				require.Equal(t, want, status, "body: %s", body)
				if status >= 400 {
					var eb struct {
						Error struct {
							Status  int    `json:"status"`
							Code    string `json:"code"`
							Message string `json:"message"`
						} `json:"error"`
					}
					require.NoError(t, json.Unmarshal([]byte(body), &eb), body)
					require.Equal(t, status, eb.Error.Status)
					require.NotEmpty(t, eb.Error.Message)
				}
				if tk.tenant == "globex" && rt.path == "/v1/runs" && rt.method == "GET" {
					require.NotContains(t, body, "acme-run", "another tenant's run is listed")
				}
			})
		}
	}

	// After all that, acme's run is cancelled by acme only, and globex
	// started nothing on acme's behalf.
	status, body = do(t, srv, "GET", "/v1/runs/acme-run", "", acmeAll)
	require.Equal(t, 200, status)
	require.Contains(t, body, `"cancelled"`)
	require.Contains(t, body, `"cancelled by acme-`, "the cancel is acme's own")
}

func hasPriv(tk token, p auth.Privilege) bool {
	for _, q := range tk.privs {
		if q == p {
			return true
		}
	}
	return false
}

// tokenName turns a caller's label into a valid token name.
func tokenName(label string) string {
	return strings.NewReplacer(" ", "-", ":", ".").Replace(label)
}
