package natsauth

import (
	"context"
	"flag"
	"os"
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

// composeOptions are the inputs of deploy/nats/nats.conf, the server
// configuration of the compose fleet.
func composeOptions() Options {
	opts := Options{
		Comment: `Server of the compose fleet (deploy/compose.yaml). Do not edit by hand:
change composeOptions in internal/natsauth/deploy_test.go and run
  go test ./internal/natsauth -run TestDeployConfig -update

Passwords come from the environment when the server loads this file; it
refuses to start when one is missing. Set:
  HARVEST_NATS_PASSWORD           user harvest (gateways, workers)
  HARVEST_NATS_HANDLERS_PASSWORD  user handlers (workflow handler services)
  HARVEST_NATS_ACME_PASSWORD      user acme (tenant acme)
  HARVEST_NATS_GLOBEX_PASSWORD    user globex (tenant globex)
  HARVEST_NATS_INITECH_PASSWORD   user initech (tenant initech)
The server reads each value as a configuration value, so use either a
bcrypt hash or a password that starts with a letter and holds only
letters, digits, '_' and '-' (secrets from auth.NewSecret qualify).

Tenant clients must set their inbox prefix to _INBOX_<tenant>
(nats.CustomInboxPrefix in Go, --inbox-prefix with the nats tool).`,
		Listen:   "0.0.0.0:4222",
		HTTP:     "0.0.0.0:8222",
		Services: []User{{Name: "harvest", Password: Env(deployPasswordEnv["harvest"])}},
		Handlers: []User{{Name: "handlers", Password: Env(deployPasswordEnv["handlers"])}},
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

	url := startDeployServer(t, sopts)
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
}

// startDeployServer runs a server from a parsed deploy configuration on
// local random ports. natsembed would keep the file's fixed monitoring
// port (8222), which a test must not take.
func startDeployServer(t *testing.T, sopts *server.Options) string {
	t.Helper()
	sopts.Host = "127.0.0.1"
	sopts.Port = server.RANDOM_PORT
	sopts.HTTPHost = "127.0.0.1"
	sopts.HTTPPort = server.RANDOM_PORT
	sopts.NoSigs = true
	sopts.NoLog = true
	ns, err := server.NewServer(sopts)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(10*time.Second), "server not ready")
	return ns.ClientURL()
}
