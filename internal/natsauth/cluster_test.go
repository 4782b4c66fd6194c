package natsauth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// clusterOptions are testOptions as a node of cluster "harvest" whose
// clients and routes listen on free local ports, dialling routes.
func clusterOptions(password Password, routes ...string) Options {
	opts := testOptions()
	opts.Listen = "127.0.0.1:-1"
	opts.Cluster = &Cluster{Name: "harvest", Listen: "127.0.0.1:-1", User: "route", Password: password, Routes: routes}
	return opts
}

// logLines keeps a server's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func (l *logLines) Noticef(format string, v ...any) { l.add(format, v...) }
func (l *logLines) Warnf(format string, v ...any)   { l.add(format, v...) }
func (l *logLines) Fatalf(format string, v ...any)  { l.add(format, v...) }
func (l *logLines) Errorf(format string, v ...any)  { l.add(format, v...) }
func (l *logLines) Debugf(format string, v ...any)  { l.add(format, v...) }
func (l *logLines) Tracef(format string, v ...any)  { l.add(format, v...) }

// startNode runs a real server on parsed options; logs, when set, gets
// its log lines.
func startNode(t *testing.T, sopts *server.Options, logs *logLines) *server.Server {
	t.Helper()
	sopts.NoSigs = true
	sopts.NoLog = logs == nil
	ns, err := server.NewServer(sopts)
	require.NoError(t, err)
	if logs != nil {
		ns.SetLoggerV2(logs, false, false, false)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(10*time.Second), "server not ready")
	return ns
}

// startConfigNode writes a generated configuration to a file, parses it
// with the server's own parser and runs a node on it.
func startConfigNode(t *testing.T, opts Options, logs *logLines) *server.Server {
	t.Helper()
	conf, err := Config(opts)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	sopts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, conf)
	return startNode(t, sopts, logs)
}

// meshed waits until every node has a route to every other.
func meshed(t *testing.T, nodes ...*server.Server) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if n.NumRemotes() != len(nodes)-1 {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "the nodes did not form a full mesh")
}

func TestClusterConfigParses(t *testing.T) {
	t.Parallel()
	opts := testOptions()
	opts.Cluster = &Cluster{Name: "harvest", Listen: "0.0.0.0:6222", User: "route", Password: Plain(`r@ute:pw/?`),
		Routes: []string{"nats1:6222", "nats2:6222", "10.0.0.3:6222"}, NoAdvertise: true}
	conf, err := Config(opts)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	sopts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, conf)
	require.Equal(t, "harvest", sopts.Cluster.Name)
	require.Equal(t, "0.0.0.0", sopts.Cluster.Host)
	require.Equal(t, 6222, sopts.Cluster.Port)
	require.Equal(t, "route", sopts.Cluster.Username)
	require.Equal(t, `r@ute:pw/?`, sopts.Cluster.Password)
	require.True(t, sopts.Cluster.NoAdvertise)
	require.Len(t, sopts.Routes, 3)
	for i, host := range []string{"nats1:6222", "nats2:6222", "10.0.0.3:6222"} {
		r := sopts.Routes[i]
		require.Equal(t, "nats-route", r.Scheme)
		require.Equal(t, host, r.Host)
		pw, _ := r.User.Password()
		require.Equal(t, "route", r.User.Username())
		require.Equal(t, `r@ute:pw/?`, pw, "the password survives URL escaping")
	}
	// The users are those of a lone server: the cluster block adds none.
	require.Len(t, sopts.Users, 5)
}

func TestClusterRefusesBadInput(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		edit func(*Cluster)
		want string
	}{
		"no name":           {func(c *Cluster) { c.Name = "" }, `cluster: name ""`},
		"name with a space": {func(c *Cluster) { c.Name = "my cluster" }, `cluster: name "my cluster"`},
		"no listen":         {func(c *Cluster) { c.Listen = "" }, `cluster: listen ""`},
		"listen port 0":     {func(c *Cluster) { c.Listen = "0.0.0.0:0" }, `cluster: listen "0.0.0.0:0"`},
		"bad user":          {func(c *Cluster) { c.User = "route user" }, `cluster: user "route user"`},
		"no password":       {func(c *Cluster) { c.Password = Password{} }, "cluster: password: no password"},
		"bcrypt password":   {func(c *Cluster) { c.Password = Bcrypt(initechHash) }, "cannot be a bcrypt hash"},
		"route without host": {func(c *Cluster) { c.Routes = []string{":6222"} },
			`cluster: route[0] ":6222": no host`},
		"route without port": {func(c *Cluster) { c.Routes = []string{"nats1"} },
			`cluster: route[0] "nats1": want host:port`},
		"route port -1": {func(c *Cluster) { c.Routes = []string{"nats1:-1"} }, `cluster: route[0] "nats1:-1": port "-1"`},
		"env password with routes": {func(c *Cluster) { c.Password = Env("ROUTE_PW") },
			"list them in RoutesEnv"},
		"routes and routes env": {func(c *Cluster) { c.RoutesEnv = "ROUTES" }, "not both"},
		"bad routes env": {func(c *Cluster) { c.Routes, c.RoutesEnv = nil, "routes" },
			`routes environment variable name "routes"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := testOptions()
			opts.Cluster = &Cluster{Name: "harvest", Listen: "0.0.0.0:6222", User: "route", Password: Plain("route-pw"),
				Routes: []string{"nats1:6222"}}
			tc.edit(opts.Cluster)
			_, err := Config(opts)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A tenant is held to its own subjects on whichever node of a cluster it
// connects to, and its requests are answered in its own inbox across the
// routes, by a gateway on another node.
func TestClusterKeepsTenantsApartOnEveryNode(t *testing.T) {
	t.Parallel()
	a := startConfigNode(t, clusterOptions(Plain("route-pw")), nil)
	seed := a.ClusterAddr().String()
	b := startConfigNode(t, clusterOptions(Plain("route-pw"), seed), nil)
	c := startConfigNode(t, clusterOptions(Plain("route-pw"), seed), nil)
	meshed(t, a, b, c)
	checkTenantsAcrossNodes(t, a.ClientURL(), b.ClientURL(), c.ClientURL(), "svc", "svc-pw",
		map[string][2]string{"acme": {"acme", "acme-pw"}, "globex": {"globex-app", "globex-pw"}})

	// A node without the route password is refused by the cluster.
	var logs logLines
	rogue := startConfigNode(t, clusterOptions(Plain("guessed"), seed), &logs)
	require.Eventually(t, func() bool { return logs.has("Authorization Violation") }, 20*time.Second, 10*time.Millisecond,
		"the rogue node's route was not refused")
	require.Zero(t, rogue.NumRemotes())
	require.Equal(t, 2, a.NumRemotes(), "node a routes to b and c only")
}

// checkTenantsAcrossNodes checks, on a running cluster, that tenant
// clients on node b and c are answered by a gateway on node a in their own
// inboxes, and that what a tenant may not do is refused on its node
// before it reaches the others. tenants maps a tenant to its user and
// password; it needs "acme" and "globex".
func checkTenantsAcrossNodes(t *testing.T, a, b, c, svcUser, svcPassword string, tenants map[string][2]string) {
	t.Helper()
	svc := connect(t, a, svcUser, svcPassword)
	serveStarts(t, svc)
	spy := connect(t, c, svcUser, svcPassword)
	seen, err := spy.SubscribeSync(">")
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	acmeUser, globexUser := tenants["acme"], tenants["globex"]
	acme := connectTenant(t, b, acmeUser[0], acmeUser[1], "acme", nats.PermissionErrOnSubscribe(true))
	globex := connectTenant(t, c, globexUser[0], globexUser[1], "globex")
	// The service's interest travels to b and c over the routes: wait for
	// it, or the first requests would find no responder.
	require.Eventually(t, func() bool {
		_, err := acme.Request(subjects.Start("acme"), []byte(`{}`), time.Second)
		return err == nil
	}, 20*time.Second, 10*time.Millisecond, "the gateway on node a never answered node b")
	for tenant, cl := range map[string]*client{"acme": acme, "globex": globex} {
		for _, subj := range []string{subjects.Start(tenant), subjects.StartBatch(tenant)} {
			reply, err := cl.Request(subj, []byte(`{}`), 10*time.Second)
			require.NoError(t, err, subj)
			require.Equal(t, subj, string(reply.Data))
			require.True(t, strings.HasPrefix(reply.Subject, InboxPrefix(tenant)+"."), reply.Subject)
		}
	}

	// Refused on acme's node: another tenant's starts, forged replies and
	// run events, internal traffic.
	denied := []string{subjects.Start("globex"), subjects.StartBatch("globex"), "_INBOX_globex.x.y", "_INBOX.x.y",
		subjects.Runs("globex", "r1"), subjects.Wake(0, "shared"), subjects.Dispatch(0, "shared")}
	for _, subj := range denied {
		require.NoError(t, acme.Publish(subj, []byte("denied")))
	}
	require.NoError(t, acme.Publish(subjects.Start("acme"), []byte("allowed")))
	require.NoError(t, acme.Flush())
	for _, subj := range denied {
		acme.violation(t, subj)
	}
	// A route keeps the order of a node's messages: had a denied one got
	// through to node c, the spy would see it before the allowed one.
	for {
		m, err := seen.NextMsg(10 * time.Second)
		require.NoError(t, err)
		if strings.HasPrefix(m.Subject, "_INBOX") || string(m.Data) == `{}` || m.Subject == subjects.StartBatch("acme") {
			continue // the requests and answers above
		}
		require.Equal(t, subjects.Start("acme"), m.Subject)
		require.Equal(t, "allowed", string(m.Data))
		break
	}

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = acme.RequestWithContext(ctx, subjects.Start("globex"), []byte(`{}`))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Nor can acme listen, on its node, to what crosses the routes for
	// another tenant.
	for _, subj := range []string{"_INBOX.>", InboxPrefix("globex") + ".>", "harvest.runs.globex.>"} {
		sub, err := acme.SubscribeSync(subj)
		require.NoError(t, err)
		_, err = sub.NextMsg(10 * time.Second)
		require.ErrorIs(t, err, nats.ErrPermissionViolation, subj)
	}
}

// The server's own pings, which bound how long a node keeps a route (and
// the interest behind it) to a peer whose machine died silently.
func TestPingSettingsParse(t *testing.T) {
	t.Parallel()
	opts := testOptions()
	opts.PingInterval, opts.PingMax = 5*time.Second, 3
	conf, err := Config(opts)
	require.NoError(t, err)
	require.Contains(t, conf, "ping_interval: \"5s\"\nping_max: 3\n")
	path := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	sopts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, conf)
	require.Equal(t, 5*time.Second, sopts.PingInterval)
	require.Equal(t, 3, sopts.MaxPingsOut)

	conf, err = Config(testOptions())
	require.NoError(t, err)
	require.NotContains(t, conf, "ping_", "the server's defaults unless asked")

	for _, bad := range []Options{{PingInterval: 1500 * time.Millisecond}, {PingInterval: -time.Second}, {PingMax: -1}} {
		o := testOptions()
		o.PingInterval, o.PingMax = bad.PingInterval, bad.PingMax
		_, err := Config(o)
		require.ErrorContains(t, err, "natsauth: ping")
	}
}
