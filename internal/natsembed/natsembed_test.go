package natsembed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines once every test has finished;
// per-test checks would trip over the servers of tests running in parallel.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartRoundTripJetStream(t *testing.T) {
	t.Parallel()
	s, err := Start(Options{})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	require.True(t, strings.HasPrefix(s.URL(), "nats://127.0.0.1:"), s.URL())
	require.NotEqual(t, "nats://127.0.0.1:4222", s.URL(), "port 0 must not mean the default port")
	require.DirExists(t, s.storeDir)

	nc, err := nats.Connect(s.URL())
	require.NoError(t, err)
	defer nc.Close()

	sub, err := nc.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("re: "), m.Data...)) })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	reply, err := nc.Request("echo", []byte("hi"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "re: hi", string(reply.Data))

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.AccountInfo(ctx)
	require.NoError(t, err)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "t.1", []byte("x"))
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs)

	nc.Close()
	s.Shutdown()
	require.NoDirExists(t, s.storeDir, "Shutdown removes the store directory")
	s.Shutdown() // idempotent
	_, err = nats.Connect(s.URL(), nats.Timeout(time.Second))
	require.Error(t, err)
}

func TestStartWithConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(`
host: 0.0.0.0
port: 4222
authorization {
  users = [ { user: alice, password: secret } ]
}
jetstream {
  store_dir: "`+filepath.Join(dir, "never-used")+`"
}
`), 0o600))

	var mu sync.Mutex
	var lines []string
	s, err := Start(Options{ConfigFile: conf, Logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, format)
	}})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	require.True(t, strings.HasPrefix(s.URL(), "nats://127.0.0.1:"), s.URL())
	require.NotEqual(t, "nats://127.0.0.1:4222", s.URL())

	_, err = nats.Connect(s.URL())
	require.Error(t, err, "the config file's users apply")
	nc, err := nats.Connect(s.URL(), nats.UserInfo("alice", "secret"))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.AccountInfo(t.Context())
	require.NoError(t, err)
	require.NoDirExists(t, filepath.Join(dir, "never-used"), "the store directory is overridden")

	mu.Lock()
	require.NotEmpty(t, lines, "Logf receives the server log")
	mu.Unlock()
}

func TestStartBadConfigFile(t *testing.T) {
	t.Parallel()
	_, err := Start(Options{ConfigFile: filepath.Join(t.TempDir(), "missing.conf")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "missing.conf")
}
