package workerbin

import (
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

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
	srv, addr, err := serveMetrics("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)), pool, &running)
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
