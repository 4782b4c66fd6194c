package workerbin

import (
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// /healthz answers while the process runs; /readyz only while the worker
// loop runs and its shard answers.
func TestHealthEndpoints(t *testing.T) {
	t.Parallel()
	pool := testsvc.NewDB(t)
	var running atomic.Bool
	srv, addr, err := serveMetrics("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)), pool, &running, &atomic.Pointer[nats.Conn]{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + addr

	require.Equal(t, http.StatusOK, status(t, base+"/healthz"))
	require.Equal(t, http.StatusServiceUnavailable, status(t, base+"/readyz"), "loop not running yet")
	running.Store(true)
	require.Equal(t, http.StatusOK, status(t, base+"/readyz"))
	require.Equal(t, http.StatusOK, status(t, base+"/metrics"))
	pool.Close()
	require.Equal(t, http.StatusServiceUnavailable, status(t, base+"/readyz"), "shard pool closed")
	require.Equal(t, http.StatusOK, status(t, base+"/healthz"))
}

// /readyz answers 503 while the worker's NATS connection is down (it claims
// by polling meanwhile) and 200 again once it is back, with no restart.
func TestReadyzFollowsNATS(t *testing.T) {
	t.Parallel()
	pool := testsvc.NewDB(t)
	ns, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { ns.Shutdown() })
	nc, err := natsconn.Connect(ns.URL(), natsconn.Options{Name: "readyz-test"})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	var running atomic.Bool
	running.Store(true)
	var conn atomic.Pointer[nats.Conn]
	conn.Store(nc)
	srv, addr, err := serveMetrics("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)), pool, &running, &conn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + addr
	require.Equal(t, http.StatusOK, status(t, base+"/readyz"))

	ns.Shutdown()
	require.Eventually(t, func() bool { return status(t, base+"/readyz") == http.StatusServiceUnavailable },
		10*time.Second, 10*time.Millisecond, "not ready while NATS is away")
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Contains(t, string(body), "nats: RECONNECTING")

	// The same port again: the connection comes back by itself.
	port, err := strconv.Atoi(ns.URL()[strings.LastIndex(ns.URL(), ":")+1:])
	require.NoError(t, err)
	var again *natsembed.Server
	require.Eventually(t, func() bool {
		again, err = natsembed.Start(natsembed.Options{Port: port, Dir: t.TempDir()})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "restart NATS on its port")
	t.Cleanup(again.Shutdown)
	require.Eventually(t, func() bool { return status(t, base+"/readyz") == http.StatusOK },
		30*time.Second, 10*time.Millisecond, "ready again once NATS is back")
}
