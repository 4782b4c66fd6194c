package natsauth

import (
	"context"
	"flag"
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
)

var update = flag.Bool("update", false, "rewrite deploy/nats/nats.conf from composeOptions")

const deployConf = "../../deploy/nats/nats.conf"

// deployPasswordEnv maps each user of deploy/nats/nats.conf to the
// environment variable holding its password.
var deployPasswordEnv = map[string]string{
	"harvest":  "HARVEST_NATS_PASSWORD",
	"handlers": "HARVEST_NATS_HANDLERS_PASSWORD",
	"acme":     "HARVEST_NATS_ACME_PASSWORD",
	"globex":   "HARVEST_NATS_GLOBEX_PASSWORD",
	"initech":  "HARVEST_NATS_INITECH_PASSWORD",
}

// The variables of the compose fleet's route password and route URLs.
const (
	deployRoutePasswordEnv = "HARVEST_NATS_ROUTE_PASSWORD"
	deployRoutesEnv        = "HARVEST_NATS_ROUTES"
)

// composeOptions are the inputs of deploy/nats/nats.conf, the server
// configuration of the compose fleet's three NATS nodes.
func composeOptions() Options {
	opts := Options{
		Comment: `Server of the compose fleet (deploy/compose.yaml): each of its three
NATS nodes (nats1, nats2, nats3) loads this same file, so the users and
their permissions are the same on every node. Do not edit by hand:
change composeOptions in internal/natsauth/deploy_test.go and run
  go test ./internal/natsauth -run TestDeployConfig -update

Passwords come from the environment when the server loads this file; it
refuses to start when one is missing. Set:
  HARVEST_NATS_PASSWORD           user harvest (gateways, workers)
  HARVEST_NATS_HANDLERS_PASSWORD  user handlers (workflow handler services)
  HARVEST_NATS_ACME_PASSWORD      user acme (tenant acme)
  HARVEST_NATS_GLOBEX_PASSWORD    user globex (tenant globex)
  HARVEST_NATS_INITECH_PASSWORD   user initech (tenant initech)
  HARVEST_NATS_ROUTE_PASSWORD     user route (the nodes, to one another)
  HARVEST_NATS_ROUTES             the nodes' route URLs, which carry the
                                  route password: [nats-route://route:
                                  <password>@nats1:6222, ...]
The server reads each value as a configuration value, so use either a
bcrypt hash or a password that starts with a letter and holds only
letters, digits, '_' and '-' (secrets from auth.NewSecret qualify); the
route password cannot be a bcrypt hash, since the nodes send it.

Tenant clients must set their inbox prefix to _INBOX_<tenant>
(nats.CustomInboxPrefix in Go, --inbox-prefix with the nats tool).`,
		Listen:   "0.0.0.0:4222",
		HTTP:     "0.0.0.0:8222",
		Services: []User{{Name: "harvest", Password: Env(deployPasswordEnv["harvest"])}},
		Handlers: []User{{Name: "handlers", Password: Env(deployPasswordEnv["handlers"])}},
		// A node whose machine dies without closing its connections is
		// dropped by its clients and peers within about 20s.
		PingInterval: 5 * time.Second, PingMax: 3,
		Cluster: &Cluster{
			Name: "harvest", Listen: "0.0.0.0:6222",
			User: "route", Password: Env(deployRoutePasswordEnv), RoutesEnv: deployRoutesEnv,
			// Every client of the fleet lists the three nodes; the container
			// addresses the nodes would advertise mean nothing on the host.
			NoAdvertise: true,
		},
	}
	for _, tenant := range []string{"acme", "globex", "initech"} {
		opts.Tenants = append(opts.Tenants, TenantUser{Name: tenant, Password: Env(deployPasswordEnv[tenant]), Tenant: tenant})
	}
	return opts
}

// TestDeployConfig checks that deploy/nats/nats.conf is what the generator
// makes, and loads the file itself into a real server to check that the
// tenants are kept apart. It sets environment variables, so it cannot run
// in parallel with other tests.
func TestDeployConfig(t *testing.T) {
	want, err := Config(composeOptions())
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile(deployConf, []byte(want), 0o644))
	}
	got, err := os.ReadFile(deployConf)
	require.NoError(t, err)
	require.Equal(t, want, string(got), "deploy/nats/nats.conf is out of date: run go test ./internal/natsauth -run TestDeployConfig -update")

	// Without its variables the file is refused.
	t.Setenv("HARVEST_NATS_PASSWORD", "unset-below")
	require.NoError(t, os.Unsetenv("HARVEST_NATS_PASSWORD"))
	_, err = server.ProcessConfigFile(deployConf)
	require.ErrorContains(t, err, "HARVEST_NATS_")

	passwords := map[string]string{}
	for user, env := range deployPasswordEnv {
		// The form the file's header recommends.
		passwords[user], err = auth.NewSecret()
		require.NoError(t, err)
		t.Setenv(env, passwords[user])
	}
	routePassword, err := auth.NewSecret()
	require.NoError(t, err)
	t.Setenv(deployRoutePasswordEnv, routePassword)
	// What deploy/compose.yaml gives every node: the three nodes' routes.
	var routes []string
	for _, host := range []string{"nats1", "nats2", "nats3"} {
		routes = append(routes, "nats-route://route:"+routePassword+"@"+host+":6222")
	}
	t.Setenv(deployRoutesEnv, "["+strings.Join(routes, ", ")+"]")
	sopts, err := server.ProcessConfigFile(deployConf)
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0", sopts.Host)
	require.Equal(t, 4222, sopts.Port)
	require.Equal(t, "0.0.0.0", sopts.HTTPHost)
	require.Equal(t, 8222, sopts.HTTPPort)
	// Nothing in the fleet uses JetStream, so the server runs without it.
	require.False(t, sopts.JetStream)
	require.Len(t, sopts.Users, len(deployPasswordEnv))
	for _, u := range sopts.Users {
		require.Equal(t, passwords[u.Username], u.Password, "password of %s from the environment", u.Username)
	}
	require.Equal(t, 5*time.Second, sopts.PingInterval)
	require.Equal(t, 3, sopts.MaxPingsOut)
	require.Equal(t, "harvest", sopts.Cluster.Name)
	require.Equal(t, "0.0.0.0", sopts.Cluster.Host)
	require.Equal(t, 6222, sopts.Cluster.Port)
	require.Equal(t, "route", sopts.Cluster.Username)
	require.Equal(t, routePassword, sopts.Cluster.Password, "route password from the environment")
	require.True(t, sopts.Cluster.NoAdvertise)
	require.Len(t, sopts.Routes, 3)
	for i, r := range sopts.Routes {
		require.Equal(t, routes[i], r.String(), "route %d from the environment", i)
	}

	url := startDeployServer(t, sopts, nil).ClientURL()
	svc := connect(t, url, "harvest", passwords["harvest"])
	serveStarts(t, svc)
	acme := connectTenant(t, url, "acme", passwords["acme"], "acme", nats.PermissionErrOnSubscribe(true))
	globex := connectTenant(t, url, "globex", passwords["globex"], "globex")

	for tenant, c := range map[string]*client{"acme": acme, "globex": globex} {
		reply, err := c.Request(subjects.Start(tenant), []byte(`{}`), 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, subjects.Start(tenant), string(reply.Data))
	}

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = acme.RequestWithContext(ctx, subjects.Start("globex"), []byte(`{}`))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	acme.violation(t, subjects.Start("globex"))

	for _, subj := range []string{"_INBOX.>", InboxPrefix("globex") + ".>", "harvest.runs.globex.>"} {
		sub, err := acme.SubscribeSync(subj)
		require.NoError(t, err)
		_, err = sub.NextMsg(10 * time.Second)
		require.ErrorIs(t, err, nats.ErrPermissionViolation, subj)
	}

	_, err = nats.Connect(url, nats.UserInfo("acme", passwords["globex"]), nats.NoReconnect(), nats.Timeout(connectTimeout))
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// The same file on three nodes, as compose runs it, on local ports:
	// each node dials the first with the route URL the environment gave
	// (its credentials), and the tenants are kept apart across them.
	var nodes []*server.Server
	for i := range 3 {
		o, err := server.ProcessConfigFile(deployConf)
		require.NoError(t, err)
		var dial []*neturl.URL
		if i > 0 {
			seed := *o.Routes[0]
			seed.Host = nodes[0].ClusterAddr().String()
			dial = []*neturl.URL{&seed}
		}
		nodes = append(nodes, startDeployServer(t, o, dial))
	}
	meshed(t, nodes...)
	checkTenantsAcrossNodes(t, nodes[0].ClientURL(), nodes[1].ClientURL(), nodes[2].ClientURL(), "harvest", passwords["harvest"],
		map[string][2]string{"acme": {"acme", passwords["acme"]}, "globex": {"globex", passwords["globex"]}})
}

// startDeployServer runs a server from a parsed deploy configuration on
// local random ports (clients, monitoring and routes), dialling routes
// instead of the file's. natsembed would keep the file's fixed monitoring
// port (8222), which a test must not take.
func startDeployServer(t *testing.T, sopts *server.Options, routes []*neturl.URL) *server.Server {
	t.Helper()
	sopts.Host = "127.0.0.1"
	sopts.Port = server.RANDOM_PORT
	sopts.HTTPHost = "127.0.0.1"
	sopts.HTTPPort = server.RANDOM_PORT
	sopts.Cluster.Host = "127.0.0.1"
	sopts.Cluster.Port = server.RANDOM_PORT
	sopts.Routes = routes
	return startNode(t, sopts, nil)
}
