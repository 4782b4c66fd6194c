package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
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

// startShippedNATS runs a NATS server from deploy/nats/nats.conf on random
// local ports.
func startShippedNATS(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	conf := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "nats", "nats.conf")
	sopts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	sopts.Host, sopts.Port = "127.0.0.1", server.RANDOM_PORT
	sopts.HTTPHost, sopts.HTTPPort = "127.0.0.1", server.RANDOM_PORT
	sopts.Cluster.Host, sopts.Cluster.Port = "127.0.0.1", server.RANDOM_PORT // a lone node of the shipped cluster
	sopts.StoreDir = filepath.Join(t.TempDir(), "js")
	sopts.NoSigs, sopts.NoLog = true, true
	ns, err := server.NewServer(sopts)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))
	return ns.ClientURL()
}

type fleet struct {
	ctx     context.Context
	natsURL string
	httpURL string
	shards  []*pgxpool.Pool
	secret  string
}

// startFleet runs a gateway (as the binary does) over two shards, behind
// the shipped NATS configuration, with a tokens file for acme.
func startFleet(t *testing.T) *fleet {
	t.Helper()
	f := &fleet{ctx: context.Background(), natsURL: startShippedNATS(t), secret: "acme-secret"}
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	for _, u := range urls {
		p, err := pgxpool.New(f.ctx, u)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		f.shards = append(f.shards, p)
	}
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte(fmt.Sprintf(
		`[{"name":"acme-ci","tenant":"acme","sha256":%q,"privileges":["runs:start","runs:read"]}]`,
		auth.HashSecret(f.secret))), 0o600))

	cfg := gateway.DefaultConfig(urls, strings.Replace(f.natsURL, "nats://", "nats://harvest:svcpw@", 1))
	cfg.Addr = "127.0.0.1:0"
	cfg.TokensFile = tokens
	require.NoError(t, cfg.Validate())
	ctx, cancel := context.WithCancel(f.ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- gateway.Run(ctx, cfg, gateway.RunOptions{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:  func(addr string) { ready <- addr },
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case addr := <-ready:
		f.httpURL = "http://" + addr
	case err := <-done:
		t.Fatalf("gateway did not start: %v", err)
	}
	return f
}

// A new user's first run: plain JSON on harvest.start.acme with a reply
// inbox, as `nats req --inbox-prefix _INBOX_acme harvest.start.acme '{...}'`
// sends it, then the run completes and is read back over HTTP.
func TestNewUserStartsARunOverNATS(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	nc, err := nats.Connect(f.natsURL, nats.UserInfo("acme", "acmepw"),
		nats.CustomInboxPrefix(natsauth.InboxPrefix("acme")))
	require.NoError(t, err)
	defer nc.Close()

	msg, err := nc.Request("harvest.start.acme", []byte(`{"name":"echo","queue":"shared","input":{"hello":"world"}}`), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "201", msg.Header.Get(gateway.StatusHeader))
	var run api.Run
	require.NoError(t, json.Unmarshal(msg.Data, &run), string(msg.Data))
	require.Equal(t, "acme", run.Tenant)
	require.Equal(t, shards.Home("acme", 2), run.Shard)
	require.Equal(t, api.StatusQueued, run.Status)

	// A worker of the home shard takes the task and completes it.
	db := f.shards[run.Shard]
	res, err := claim.Claim(f.ctx, db, claim.Request{Queue: "shared", Worker: "w1", Fair: true})
	require.NoError(t, err)
	require.True(t, res.OK)
	require.JSONEq(t, `{"hello":"world"}`, string(res.Task.Input))
	require.NoError(t, claim.Complete(f.ctx, db, res.Task.ID, res.Task.LeaseToken, res.Task.Input))

	req, err := http.NewRequest("GET", f.httpURL+"/v1/runs/"+run.ID+"?wait=10s", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+f.secret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var done api.Run
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&done))
	require.Equal(t, api.StatusCompleted, done.Status)
	require.JSONEq(t, `{"hello":"world"}`, string(done.Output))
}

// The shipped NATS permissions: a tenant starts runs for itself only and
// hears only its own replies.
func TestNATSPermissionsOfTheShippedConfig(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	errs := make(chan error, 8)
	nc, err := nats.Connect(f.natsURL, nats.UserInfo("acme", "acmepw"),
		nats.CustomInboxPrefix(natsauth.InboxPrefix("acme")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	require.NoError(t, err)
	defer nc.Close()

	// Its own batch subject works.
	msg, err := nc.Request("harvest.start_batch.acme", []byte(`{"runs":[{"name":"echo","queue":"shared"}]}`), 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(msg.Data), `"run"`)

	// Another tenant's subject is refused by the server: no gateway sees it.
	require.NoError(t, nc.Publish("harvest.start.globex", []byte(`{"name":"echo","queue":"shared"}`)))
	require.NoError(t, nc.Flush())
	select {
	case err := <-errs:
		require.ErrorContains(t, err, "Permissions Violation")
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation reported")
	}
	_, err = nc.SubscribeSync("_INBOX.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	select {
	case err := <-errs:
		require.ErrorContains(t, err, "Permissions Violation")
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation for the shared inbox")
	}
	globex := shards.Home("globex", 2)
	var n int
	require.NoError(t, f.shards[globex].QueryRow(f.ctx, `SELECT count(*) FROM runs WHERE tenant = 'globex'`).Scan(&n))
	require.Zero(t, n)

	// Over HTTP the tokens file decides.
	req, err := http.NewRequest("POST", f.httpURL+"/v1/runs", strings.NewReader(`{"name":"echo","queue":"shared"}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode)
}

func TestGatewayHelpListsEveryVariable(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	require.Equal(t, 0, gateway.Main([]string{"--help"}, &out, io.Discard))
	for _, v := range []string{"HARVEST_SHARDS", "HARVEST_NATS_URL", "HARVEST_GATEWAY_ADDR", "HARVEST_GATEWAY_TOKENS_FILE",
		"HARVEST_GATEWAY_MAX_BODY_BYTES", "HARVEST_GATEWAY_KEY_BINDING", "HARVEST_GATEWAY_SUBJECT_PREFIX"} {
		require.Contains(t, out.String(), v)
	}
}
