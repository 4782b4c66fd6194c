package telemetry_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func scrape(t *testing.T) string {
	t.Helper()
	rec := httptest.NewRecorder()
	telemetry.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Body)
	require.NoError(t, err)
	return string(b)
}

// /metrics shows the Go runtime and the process, and the pools and NATS
// connections registered, pools added up by shard, until they are
// unregistered; the page passes promlint. Not parallel: Setup installs
// the process's registry.
func TestRegisteredPoolsAndConnectionsOnMetrics(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	shutdown, err := telemetry.Setup(context.Background(), "stats-test")
	require.NoError(t, err)
	defer func() { require.NoError(t, shutdown(context.Background())) }()

	a, b := testsvc.NewDB(t), testsvc.NewDB(t)
	require.NoError(t, a.Ping(context.Background()))
	require.NoError(t, b.Ping(context.Background()))
	nc, err := nats.Connect(testsvc.NATSURL(t))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Publish("stats.test", []byte("hello")))
	require.NoError(t, nc.Flush())

	page := scrape(t)
	require.Contains(t, page, "go_goroutines ")
	require.Contains(t, page, "process_cpu_seconds_total ")
	require.NotContains(t, page, "harvest_pgx_pool_")
	require.NotContains(t, page, "harvest_nats_")

	offA := telemetry.RegisterPool(3, a)
	offB := telemetry.RegisterPool(3, b)
	offNC := telemetry.RegisterNATS(nc)
	page = scrape(t)
	maxConns := a.Stat().MaxConns() + b.Stat().MaxConns()
	require.Contains(t, page, `harvest_pgx_pool_max_connections{shard="3"} `+itoa(maxConns)+"\n", "pools of one shard are added up")
	require.Contains(t, page, `harvest_pgx_pool_acquires_total{shard="3"} `)
	require.Contains(t, page, "harvest_nats_connected_connections 1\n")
	require.Contains(t, page, "harvest_nats_sent_messages_total 1\n")
	require.Contains(t, page, "harvest_nats_sent_bytes_total 5\n")
	problems, err := promlint.New(strings.NewReader(page)).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)

	offA()
	offA() // a second call does nothing
	page = scrape(t)
	require.Contains(t, page, `harvest_pgx_pool_max_connections{shard="3"} `+itoa(b.Stat().MaxConns())+"\n")
	offB()
	offNC()
	page = scrape(t)
	require.NotContains(t, page, "harvest_pgx_pool_")
	require.NotContains(t, page, "harvest_nats_")
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
