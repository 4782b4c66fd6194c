package access

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// shippedNATS runs a NATS server from deploy/nats/nats.conf on random
// local ports.
func shippedNATS(t *testing.T) string {
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

// shippedGateway runs a gateway on fresh shards behind the shipped NATS
// configuration, connected as the service user, and returns the server's
// URL, the service connection and the shard URLs.
func shippedGateway(t *testing.T, shards int) (string, *nats.Conn, []string) {
	t.Helper()
	url := shippedNATS(t)
	urls := make([]string, shards)
	for i := range urls {
		urls[i] = testsvc.NewDBURL(t)
	}
	svc, err := nats.Connect(url, nats.UserInfo("harvest", passwords["HARVEST_NATS_PASSWORD"]))
	require.NoError(t, err)
	t.Cleanup(svc.Close)
	cfg := gateway.DefaultConfig(urls, url)
	cfg.MaxRuns = 1_000_000
	g, err := gateway.New(gateway.Options{Config: cfg, NATS: svc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(g.Close)
	require.NoError(t, g.ServeNATS())
	return url, svc, urls
}

// tenantConn connects as a tenant of the shipped config and collects the
// server's asynchronous errors (permission violations).
func tenantConn(t *testing.T, url, tenant string) (*nats.Conn, chan error) {
	t.Helper()
	errs := make(chan error, 64)
	nc, err := nats.Connect(url, nats.UserInfo(tenant, passwords["HARVEST_NATS_"+strings.ToUpper(tenant)+"_PASSWORD"]),
		nats.CustomInboxPrefix(natsauth.InboxPrefix(tenant)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, errs
}

func violation(t *testing.T, errs chan error, what string) {
	t.Helper()
	select {
	case err := <-errs:
		require.ErrorContains(t, err, "Permissions Violation", what)
	case <-time.After(10 * time.Second):
		t.Fatalf("no permissions violation for %s", what)
	}
}

// TestNATSTenantIsolation runs a gateway behind the shipped NATS
// configuration. Tenant acme cannot start runs on globex's subjects (one
// or batch, publish or request), cannot subscribe to globex's run events
// (nor to every tenant's, nor to everything), cannot forge run events,
// wake-ups, dispatches or weight changes, and cannot take the gateways'
// start requests or the handlers' tasks. A real run event of globex is
// heard by globex and not by acme.
func TestNATSTenantIsolation(t *testing.T) {
	url, svc, urls := shippedGateway(t, 2)

	acme, acmeErrs := tenantConn(t, url, "acme")
	globex, _ := tenantConn(t, url, "globex")

	// Its own start works, so what fails below fails for permissions.
	msg, err := acme.Request("harvest.start.acme", []byte(`{"id":"own","name":"echo","queue":"q"}`), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "201", msg.Header.Get(gateway.StatusHeader), string(msg.Data))

	// Starts on globex's subjects are refused by the server.
	for _, subj := range []string{"harvest.start.globex", "harvest.start_batch.globex"} {
		require.NoError(t, acme.Publish(subj, []byte(`{"name":"echo","queue":"q"}`)))
		require.NoError(t, acme.Flush())
		violation(t, acmeErrs, "publish on "+subj)
		_, err := acme.Request(subj, []byte(`{"runs":[{"name":"echo","queue":"q"}]}`), time.Second)
		require.Error(t, err, "a request on %s gets no answer", subj)
		violation(t, acmeErrs, "request on "+subj)
	}
	db, err := pgxpool.New(t.Context(), urls[shards.Home("globex", 2)])
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM runs WHERE tenant = 'globex'`).Scan(&n))
	require.Zero(t, n, "acme started a run for globex")

	// Subscriptions to other tenants' events, all events, or the
	// service's subjects are refused.
	for _, subj := range []string{"harvest.runs.globex.>", "harvest.runs.globex.own", "harvest.runs.*.own", "harvest.runs.>",
		">", "harvest.start.>", "harvest.start.globex", "harvest.handle.>", "_INBOX_globex.>", "_INBOX.>"} {
		_, err := acme.SubscribeSync(subj)
		require.NoError(t, err) // refused asynchronously by the server
		require.NoError(t, acme.Flush())
		violation(t, acmeErrs, "subscribe "+subj)
	}
	// Publishing what only the service publishes is refused.
	for _, subj := range []string{"harvest.runs.acme.own", "harvest.runs.globex.x", "harvest.wake.0.q",
		"harvest.dispatch.0.q", "harvest.weights.q"} {
		require.NoError(t, acme.Publish(subj, []byte(`{}`)))
		require.NoError(t, acme.Flush())
		violation(t, acmeErrs, "publish on "+subj)
	}

	// A real event of a globex run: globex hears it, acme does not.
	mine, err := acme.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)
	theirs, err := globex.SubscribeSync("harvest.runs.globex.>")
	require.NoError(t, err)
	require.NoError(t, acme.Flush())
	require.NoError(t, globex.Flush())
	require.NoError(t, svc.Publish("harvest.runs.globex.r1", []byte(`{"id":"r1","tenant":"globex","status":"completed"}`)))
	require.NoError(t, svc.Flush())
	got, err := theirs.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Contains(t, string(got.Data), `"globex"`)
	_, err = mine.NextMsg(200 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "acme heard globex's run event")
}

// The gateway publishes with the service's user, which may publish
// anywhere, so it answers a start only on the caller's own inbox: acme
// names globex's inbox and run events and the workers' dispatch subject as
// reply subjects, and nobody there hears a thing, nor is a run started.
func TestNATSRepliesGoOnlyToTheCallersInbox(t *testing.T) {
	url, svc, urls := shippedGateway(t, 1)

	acme, _ := tenantConn(t, url, "acme")
	globex, _ := tenantConn(t, url, "globex")
	heard := make(chan *nats.Msg, 16)
	for _, subj := range []string{"_INBOX_globex.>", "harvest.runs.globex.>"} {
		_, err := globex.ChanSubscribe(subj, heard)
		require.NoError(t, err)
	}
	require.NoError(t, globex.Flush())
	_, err := svc.ChanSubscribe("harvest.dispatch.*.default", heard) // the start below is on queue q
	require.NoError(t, err)
	require.NoError(t, svc.Flush())

	foreign := []string{"_INBOX_globex.x", "harvest.runs.globex.r1", "harvest.dispatch.0.default",
		"_INBOX_acmeX.y", "_INBOX_acme"}
	for i, reply := range foreign {
		body := fmt.Sprintf(`{"id":"foreign-%d","name":"echo","queue":"q"}`, i)
		require.NoError(t, acme.PublishRequest("harvest.start.acme", reply, []byte(body)))
		require.NoError(t, acme.PublishRequest("harvest.start_batch.acme", reply, []byte(`{"runs":[`+body+`]}`)))
	}
	require.NoError(t, acme.Flush())
	// A start with acme's own inbox is answered. The refusals above happen
	// before any database work, so by the time this answer (which commits
	// a run) arrives they are long done.
	msg, err := acme.Request("harvest.start.acme", []byte(`{"id":"own","name":"echo","queue":"q"}`), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "201", msg.Header.Get(gateway.StatusHeader), string(msg.Data))
	select {
	case m := <-heard:
		t.Fatalf("an answer reached %s: %s", m.Subject, m.Data)
	case <-time.After(200 * time.Millisecond):
	}
	db, err := pgxpool.New(t.Context(), urls[0])
	require.NoError(t, err)
	defer db.Close()
	var ids []string
	rows, err := db.Query(t.Context(), `SELECT id FROM runs WHERE tenant = 'acme' ORDER BY id`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"own"}, ids, "only the start with acme's own inbox was taken")
}
