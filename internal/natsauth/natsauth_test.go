package natsauth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// TestMain checks for leaked goroutines once every test has finished;
// per-test checks would trip over the servers of tests running in parallel.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// initechHash is a bcrypt hash of initechPassword, at the lowest cost to
// keep connecting fast under the race detector.
const (
	initechHash     = "$2a$04$A7DYOD9fNY1RGGCP3v9d8uF2UG6nvsA2CJPTQpFRIJRzTHYKicT1q"
	initechPassword = "initech-bcrypt-pw"
)

var subjects = dispatch.Subjects{}

// connectTimeout is generous: checking a bcrypt password under the race
// detector on a busy machine can exceed nats.go's two-second default.
const connectTimeout = 20 * time.Second

func testOptions() Options {
	return Options{
		Services: []User{{Name: "svc", Password: Plain("svc-pw")}},
		Handlers: []User{{Name: "hand", Password: Plain(`hand "pw" \ with $ signs`)}},
		Tenants: []TenantUser{
			{Name: "acme", Password: Plain("acme-pw"), Tenant: "acme"},
			{Name: "globex-app", Password: Plain("globex-pw"), Tenant: "globex"},
			{Name: "initech", Password: Bcrypt(initechHash), Tenant: "initech"},
		},
	}
}

// startServer writes conf to a file and runs a real embedded server on it.
func startServer(t *testing.T, conf string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	s, err := natsembed.Start(natsembed.Options{ConfigFile: path, Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	return s.URL()
}

func startTestServer(t *testing.T) string {
	t.Helper()
	conf, err := Config(testOptions())
	require.NoError(t, err)
	return startServer(t, conf)
}

// client is a connection plus the asynchronous errors the server sent it.
type client struct {
	*nats.Conn
	errs chan error
}

func connect(t *testing.T, url, user, password string, opts ...nats.Option) *client {
	t.Helper()
	c := &client{errs: make(chan error, 64)}
	opts = append([]nats.Option{
		nats.UserInfo(user, password),
		nats.Timeout(connectTimeout),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { c.errs <- err }),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

func connectTenant(t *testing.T, url, user, password, tenant string, opts ...nats.Option) *client {
	t.Helper()
	return connect(t, url, user, password, append(opts, nats.CustomInboxPrefix(InboxPrefix(tenant)))...)
}

// violation waits for the permissions error the server sends about subject.
func (c *client) violation(t *testing.T, subject string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation reported for %q", subject)
		}
	}
}

// serveStarts answers every start and batch start, as a gateway would,
// with the subject it was sent on.
func serveStarts(t *testing.T, svc *client) {
	t.Helper()
	for _, subj := range []string{subjects.StartAll(), subjects.StartBatchAll()} {
		_, err := svc.QueueSubscribe(subj, "gateways", func(m *nats.Msg) { _ = m.Respond([]byte(m.Subject)) })
		require.NoError(t, err)
	}
	require.NoError(t, svc.Flush())
}

func TestInboxPrefix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "_INBOX_acme", InboxPrefix("acme"))
	require.True(t, OwnInbox("acme", "_INBOX_acme.abc.1"))
	for _, reply := range []string{"", "_INBOX_acme", "_INBOX_acme.", "_INBOX.abc", "_INBOX_acme2.abc", "_INBOX_globex.abc"} {
		require.False(t, OwnInbox("acme", reply), reply)
	}
}

func TestTenantPermissionsFollowDispatchSubjects(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", "harvest", "eu.harvest"} {
		s := dispatch.Subjects{Prefix: prefix}
		pub, sub := TenantPermissions(prefix, "acme")
		require.Equal(t, []string{s.Start("acme"), s.StartBatch("acme")}, pub)
		require.Equal(t, "_INBOX_acme.>", sub[0])
		runs := s.Runs("acme", "run.with.dots")
		require.True(t, strings.HasPrefix(runs, strings.TrimSuffix(sub[1], ">")), "%s covers %s", sub[1], runs)
		require.Equal(t, 1, strings.Count(strings.TrimPrefix(runs, strings.TrimSuffix(sub[1], ">")), ".")+1,
			"one token after the tenant")
	}
}

func TestConfigIsDeterministic(t *testing.T) {
	t.Parallel()
	a, err := Config(testOptions())
	require.NoError(t, err)
	b, err := Config(testOptions())
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.Contains(t, a, `publish: {allow: ["harvest.start.acme", "harvest.start_batch.acme"]}`)
	require.Contains(t, a, `subscribe: {allow: ["_INBOX_acme.>", "harvest.runs.acme.>"]}`)
	require.Contains(t, a, `subscribe: {allow: ["harvest.handle.>"]}`)
	require.Contains(t, a, `allow_responses: true`)
	require.Contains(t, a, `password: "`+initechHash+`"`)
	require.NotContains(t, a, "listen:")
	require.NotContains(t, a, "jetstream")
}

func TestConfigOptionalLines(t *testing.T) {
	t.Parallel()
	opts := testOptions()
	opts.Comment = "line one\n\nline three\n"
	opts.Listen = "0.0.0.0:4222"
	opts.HTTP = "0.0.0.0:8222"
	opts.JetStream = true
	opts.StoreDir = "/data/js"
	opts.Prefix = "eu.harvest"
	opts.HandlerReplyWindow = time.Hour
	conf, err := Config(opts)
	require.NoError(t, err)
	require.Contains(t, conf, "#\n# line one\n#\n# line three\n\n")
	require.Contains(t, conf, `listen: "0.0.0.0:4222"`)
	require.Contains(t, conf, `http: "0.0.0.0:8222"`)
	require.Contains(t, conf, "jetstream {\n  store_dir: \"/data/js\"\n}")
	require.Contains(t, conf, `"eu.harvest.start.acme"`)
	require.Contains(t, conf, `"eu.harvest.handle.>"`)
	require.Contains(t, conf, `allow_responses: {max: 1, expires: "1h0m0s"}`)

	opts.StoreDir = ""
	opts.HandlerReplyWindow = -1
	conf, err = Config(opts)
	require.NoError(t, err)
	require.Contains(t, conf, "jetstream: enabled\n")
	require.Contains(t, conf, `allow_responses: {max: 1, expires: "-1s"}`)
}

func TestConfigRefusesBadInput(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		edit func(*Options)
		want string
	}{
		"no service":            {func(o *Options) { o.Services = nil }, "service user"},
		"bad prefix":            {func(o *Options) { o.Prefix = "harvest.*" }, `prefix "harvest.*"`},
		"empty prefix token":    {func(o *Options) { o.Prefix = "a..b" }, "prefix"},
		"bad tenant":            {func(o *Options) { o.Tenants[0].Tenant = "acme.eu" }, `tenant[0] ("acme")`},
		"empty tenant":          {func(o *Options) { o.Tenants[1].Tenant = "" }, `tenant[1] ("globex-app")`},
		"long tenant":           {func(o *Options) { o.Tenants[0].Tenant = strings.Repeat("a", 65) }, "limit is 64"},
		"bad user name":         {func(o *Options) { o.Services[0].Name = "svc user" }, `service[0] ("svc user")`},
		"empty user name":       {func(o *Options) { o.Handlers[0].Name = "" }, `handler[0] ("")`},
		"duplicate user":        {func(o *Options) { o.Tenants[1].Name = "svc" }, `already used by service[0]`},
		"no password":           {func(o *Options) { o.Tenants[0].Password = Password{} }, "no password"},
		"empty plain":           {func(o *Options) { o.Services[0].Password = Plain("") }, "empty plain password"},
		"plain like bcrypt":     {func(o *Options) { o.Services[0].Password = Plain(initechHash) }, "looks like a bcrypt hash"},
		"control char":          {func(o *Options) { o.Services[0].Password = Plain("a\nb") }, "control character"},
		"bad bcrypt":            {func(o *Options) { o.Tenants[2].Password = Bcrypt("$2a$10$short") }, "not a bcrypt hash"},
		"bad env name":          {func(o *Options) { o.Services[0].Password = Env("password") }, `environment variable name "password"`},
		"env starts with digit": {func(o *Options) { o.Services[0].Password = Env("1PW") }, "environment variable name"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := testOptions()
			c.edit(&opts)
			_, err := Config(opts)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

func TestTenantRequestReply(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	serveStarts(t, connect(t, url, "svc", "svc-pw"))

	for _, tc := range []struct{ user, password, tenant string }{
		{"acme", "acme-pw", "acme"},
		{"globex-app", "globex-pw", "globex"},
		{"initech", initechPassword, "initech"}, // bcrypt-hashed in the file
	} {
		c := connectTenant(t, url, tc.user, tc.password, tc.tenant)
		for _, subj := range []string{subjects.Start(tc.tenant), subjects.StartBatch(tc.tenant)} {
			reply, err := c.Request(subj, []byte(`{}`), 10*time.Second)
			require.NoError(t, err, subj)
			require.Equal(t, subj, string(reply.Data))
			require.True(t, strings.HasPrefix(reply.Subject, InboxPrefix(tc.tenant)+"."), reply.Subject)
		}
	}
}

func TestTenantPublishesOnlyItsOwnStarts(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	// A spy with full rights sees every message that gets through.
	spy := connect(t, url, "svc", "svc-pw")
	seen, err := spy.SubscribeSync(">")
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	acme := connectTenant(t, url, "acme", "acme-pw", "acme")
	denied := []string{
		subjects.Start("globex"),
		subjects.StartBatch("globex"),
		subjects.Runs("acme", "r1"),    // no forged run events
		"_INBOX_globex.x.y",            // no forged replies to another tenant
		"_INBOX.x.y",                   //
		subjects.Wake(0, "shared"),     // no internal traffic
		subjects.Dispatch(0, "shared"), //
		subjects.Weights("shared"),     //
		subjects.Handle("wf"),          //
		"$JS.API.INFO",                 // no JetStream
	}
	for _, subj := range denied {
		require.NoError(t, acme.Publish(subj, []byte("denied")), "the client only learns asynchronously")
	}
	require.NoError(t, acme.Publish(subjects.Start("acme"), []byte("allowed")))
	require.NoError(t, acme.Flush())
	for _, subj := range denied {
		acme.violation(t, subj)
	}

	// The server handles one connection's messages in order: had any
	// denied message got through, the spy would see it first.
	m, err := seen.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, subjects.Start("acme"), m.Subject)
	require.Equal(t, "allowed", string(m.Data))
}

func TestTenantRequestOnAnotherTenantFails(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	serveStarts(t, connect(t, url, "svc", "svc-pw"))
	acme := connectTenant(t, url, "acme", "acme-pw", "acme")

	// What a user sees: the request gets no answer and a permissions
	// error arrives on the connection's error handler.
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := acme.RequestWithContext(ctx, subjects.Start("globex"), []byte(`{}`))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	acme.violation(t, subjects.Start("globex"))
}

func TestTenantSubscriptions(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	svc := connect(t, url, "svc", "svc-pw")
	acme := connectTenant(t, url, "acme", "acme-pw", "acme", nats.PermissionErrOnSubscribe(true))

	for _, subj := range []string{
		"_INBOX.>",
		"_INBOX.abc.*",
		InboxPrefix("globex") + ".>",
		subjects.Runs("globex", "r1"),
		"harvest.runs.globex.>",
		"harvest.runs.*.>",
		"harvest.runs.>",
		subjects.StartAll(),
		subjects.Start("acme"), // its own start subject is publish-only
		"harvest.>",
		">",
	} {
		sub, err := acme.SubscribeSync(subj)
		require.NoError(t, err, "the client only learns asynchronously")
		_, err = sub.NextMsg(10 * time.Second)
		require.ErrorIs(t, err, nats.ErrPermissionViolation, subj)
		require.ErrorContains(t, err, `"`+subj+`"`)
	}

	runs, err := acme.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)
	inbox, err := acme.SubscribeSync(InboxPrefix("acme") + ".>")
	require.NoError(t, err)
	require.NoError(t, acme.Flush())
	require.NoError(t, svc.Publish(subjects.Runs("acme", "run-1"), []byte("done")))
	require.NoError(t, svc.Publish(InboxPrefix("acme")+".x.1", []byte("reply")))
	m, err := runs.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, subjects.Runs("acme", "run-1"), m.Subject)
	m, err = inbox.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "reply", string(m.Data))
}

func TestTenantWithoutCustomInboxGetsNoReply(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	serveStarts(t, connect(t, url, "svc", "svc-pw"))
	acme := connect(t, url, "acme", "acme-pw") // default "_INBOX" prefix

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := acme.RequestWithContext(ctx, subjects.Start("acme"), []byte(`{}`))
	require.Error(t, err)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-acme.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `Subscription to "_INBOX.`) {
				return
			}
		case <-deadline:
			t.Fatal("no permissions violation for the default inbox")
		}
	}
}

func TestWrongCredentialsCannotConnect(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	for _, tc := range []struct{ user, password string }{
		{"acme", "wrong"},
		{"acme", "globex-pw"},
		{"initech", initechHash}, // the hash is not the password
		{"nobody", "acme-pw"},
		{"", ""},
	} {
		opts := []nats.Option{nats.NoReconnect(), nats.Timeout(connectTimeout)}
		if tc.user != "" {
			opts = append(opts, nats.UserInfo(tc.user, tc.password))
		}
		nc, err := nats.Connect(url, opts...)
		if nc != nil {
			nc.Close()
		}
		require.ErrorIs(t, err, nats.ErrAuthorization, "%s/%s", tc.user, tc.password)
	}
}

func TestHandlerUser(t *testing.T) {
	t.Parallel()
	url := startTestServer(t)
	svc := connect(t, url, "svc", "svc-pw")
	hand := connect(t, url, "hand", `hand "pw" \ with $ signs`, nats.PermissionErrOnSubscribe(true))

	_, err := hand.QueueSubscribe("harvest.handle.>", "handlers", func(m *nats.Msg) {
		_ = m.Respond(append([]byte("ran "), m.Data...))
	})
	require.NoError(t, err)
	require.NoError(t, hand.Flush())
	reply, err := svc.Request(subjects.Handle("checkout"), []byte("task"), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ran task", string(reply.Data))

	require.NoError(t, hand.Publish(subjects.Start("acme"), nil))
	hand.violation(t, subjects.Start("acme"))
	sub, err := hand.SubscribeSync(subjects.StartAll())
	require.NoError(t, err)
	_, err = sub.NextMsg(10 * time.Second)
	require.ErrorIs(t, err, nats.ErrPermissionViolation)
}
