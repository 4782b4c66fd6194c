package natsconn

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Every connection gets the whole list and reconnects for ever, with
// jitter, a name and fast pings; a command fails instead of retrying in
// the background; a caller's extra options come last.
func TestSettingsCarryTheListAndReconnect(t *testing.T) {
	t.Parallel()
	o, err := Settings(" nats://u:p@a:4222, nats://u:p@b:4222 ,,nats://u:p@c:4222", Options{Name: "harvest-gateway"})
	require.NoError(t, err)
	require.Equal(t, []string{"nats://u:p@a:4222", "nats://u:p@b:4222", "nats://u:p@c:4222"}, o.Servers)
	require.Empty(t, o.Url, "the list, not one URL")
	require.False(t, o.NoRandomize, "a fleet spreads over the nodes")
	require.Equal(t, "harvest-gateway", o.Name)
	require.True(t, o.AllowReconnect)
	require.Equal(t, -1, o.MaxReconnect)
	require.Equal(t, ReconnectWait, o.ReconnectWait)
	require.Equal(t, ReconnectJitter, o.ReconnectJitter)
	require.Equal(t, ReconnectJitterTLS, o.ReconnectJitterTLS)
	require.Equal(t, PingInterval, o.PingInterval)
	require.Equal(t, MaxPingsOut, o.MaxPingsOut)
	require.Equal(t, DialTimeout, o.Timeout)
	require.True(t, o.RetryOnFailedConnect)

	o, err = Settings("nats://a:4222", Options{Name: "harvest-cli", FailFast: true}, nats.Timeout(time.Second))
	require.NoError(t, err)
	require.False(t, o.RetryOnFailedConnect, "a command fails when no server answers")
	require.Equal(t, -1, o.MaxReconnect)
	require.Equal(t, time.Second, o.Timeout, "extra options override")

	_, err = Settings(" , ", Options{})
	require.ErrorContains(t, err, "no NATS server URL")
}

// A command's failed connect names the servers it tried, without their
// passwords.
func TestConnectFailFastHidesPasswords(t *testing.T) {
	t.Parallel()
	_, err := Connect("nats://u:hunter2@127.0.0.1:1,nats://u:hunter2@127.0.0.1:2", Options{FailFast: true}, nats.Timeout(200*time.Millisecond))
	require.Error(t, err)
	require.Contains(t, err.Error(), "127.0.0.1:2")
	require.NotContains(t, err.Error(), "hunter2")
}

// startNode runs one node of a test cluster on random local ports.
func startNode(t *testing.T, name string, routes ...string) *server.Server {
	t.Helper()
	o := &server.Options{
		ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "natsconn-test", Host: "127.0.0.1", Port: server.RANDOM_PORT},
	}
	for _, r := range routes {
		u, err := url.Parse(r)
		require.NoError(t, err)
		o.Routes = append(o.Routes, u)
	}
	ns, err := server.NewServer(o)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(10*time.Second))
	return ns
}

// The node a service is connected to goes away: the connection moves to
// the other node by itself, and its subscriptions (plain and queue group)
// and requests work there, without the service doing anything.
func TestNodeLossMovesTheConnectionAndItsSubscriptions(t *testing.T) {
	t.Parallel()
	a := startNode(t, "a")
	b := startNode(t, "b", "nats://"+a.ClusterAddr().String())
	require.Eventually(t, func() bool { return a.NumRoutes() > 0 && b.NumRoutes() > 0 }, 10*time.Second, 10*time.Millisecond)
	nodes := map[string]*server.Server{a.ClientURL(): a, b.ClientURL(): b}

	var logs syncBuffer
	svc, err := Connect(a.ClientURL()+","+b.ClientURL(), Options{
		Name: "svc", Logger: slog.New(slog.NewTextHandler(&logs, nil)), Meanwhile: "starts pause",
	})
	require.NoError(t, err)
	t.Cleanup(svc.Close)
	// Tells the test of the reconnect without replacing the handlers.
	reconnected := svc.StatusChanged(nats.CONNECTED)

	events, err := svc.SubscribeSync("events.>")
	require.NoError(t, err)
	_, err = svc.QueueSubscribe("start.*", "gateways", func(m *nats.Msg) { _ = m.Respond([]byte("ok " + m.Subject)) })
	require.NoError(t, err)
	require.NoError(t, svc.Flush())

	first := svc.ConnectedUrl()
	require.Contains(t, nodes, first)
	var other *server.Server
	for u, n := range nodes {
		if u != first {
			other = n
		}
	}
	nodes[first].Shutdown()

	select {
	case <-reconnected:
		require.Equal(t, other.ClientURL(), svc.ConnectedUrl())
	case <-time.After(30 * time.Second):
		t.Fatal("no reconnect to the other node")
	}
	require.NoError(t, svc.Flush(), "the subscriptions are on the other node once this returns")

	pub, err := nats.Connect(other.ClientURL())
	require.NoError(t, err)
	t.Cleanup(pub.Close)
	require.NoError(t, pub.Publish("events.1", []byte("after")))
	m, err := events.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "after", string(m.Data))
	reply, err := pub.Request("start.acme", nil, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok start.acme", string(reply.Data))

	// The handlers run on nats.go's callback goroutine.
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "NATS disconnected: starts pause until it is back") &&
			strings.Contains(logs.String(), "NATS reconnected")
	}, 10*time.Second, 10*time.Millisecond, logs.String())
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Every NATS connection of the product's code is made here, so that one
// set of options holds for all of them: no non-test file of the module
// calls nats.Connect. (examples/, bench/ and tools/ are modules of their
// own.)
func TestEveryConnectionGoesThroughTheHelper(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	var offenders []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "examples", "tools", "bench", ".git", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		natsName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"github.com/nats-io/nats.go"` {
				natsName = "nats"
				if imp.Name != nil {
					natsName = imp.Name.Name
				}
			}
		}
		if natsName == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == natsName && sel.Sel.Name == "Connect" {
				offenders = append(offenders, path)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, offenders, "connect through natsconn.Connect")
}
