package metrics

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// build compiles the command pkg into the test's temporary directory.
func build(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// run starts bin with env added to the test's environment and stops it
// (SIGTERM, then SIGKILL after 30 s) at the end of the test, logging its
// standard error when the test failed.
func run(t *testing.T, bin string, env ...string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin)
	// Exporting would need a collector; /metrics is what is tested.
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", filepath.Base(bin), &stderr)
		}
	})
}

// scrapeUntil reads url until every pattern of want matches the page, and
// returns the page.
func scrapeUntil(t *testing.T, url string, want []*regexp.Regexp) string {
	t.Helper()
	var page string
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return false
		}
		page = string(b)
		for _, re := range want {
			if !re.MatchString(page) {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "series missing from %s", url)
	return page
}

// lint fails the test for every finding of promlint on page: metric names,
// units, counter suffixes and help texts by the Prometheus conventions.
func lint(t *testing.T, page string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(page)).Lint()
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// leBuckets returns the upper bounds of the buckets of histogram name (of
// its first series).
func leBuckets(t *testing.T, page, name string) []float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + name + `_bucket\{[^}]*le="([^"]+)"`)
	var les []float64
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		le, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		if len(les) > 0 && le <= les[len(les)-1] {
			break // the next series starts
		}
		les = append(les, le)
	}
	return les
}

// The series of the process itself, present on the page of every binary.
var processSeries = []*regexp.Regexp{
	regexp.MustCompile(`(?m)^go_goroutines [0-9]`),
	regexp.MustCompile(`(?m)^go_memstats_heap_alloc_bytes [0-9]`),
	regexp.MustCompile(`(?m)^process_resident_memory_bytes [0-9]`),
	regexp.MustCompile(`(?m)^process_open_fds [0-9]`),
	regexp.MustCompile(`(?m)^harvest_nats_connected_connections 1$`),
	regexp.MustCompile(`(?m)^harvest_nats_sent_messages_total [0-9]`),
	regexp.MustCompile(`(?m)^harvest_nats_received_messages_total [0-9]`),
	regexp.MustCompile(`(?m)^harvest_nats_sent_bytes_total [0-9]`),
	regexp.MustCompile(`(?m)^harvest_nats_received_bytes_total [0-9]`),
	regexp.MustCompile(`(?m)^harvest_nats_reconnects_total 0$`),
}

// The series of the Postgres pool of shard.
func poolSeries(shard int) []*regexp.Regexp {
	s := strconv.Itoa(shard)
	return []*regexp.Regexp{
		regexp.MustCompile(`(?m)^harvest_pgx_pool_acquired_connections\{shard="` + s + `"\} [0-9]`),
		regexp.MustCompile(`(?m)^harvest_pgx_pool_idle_connections\{shard="` + s + `"\} [0-9]`),
		regexp.MustCompile(`(?m)^harvest_pgx_pool_max_connections\{shard="` + s + `"\} [1-9]`),
		regexp.MustCompile(`(?m)^harvest_pgx_pool_acquires_total\{shard="` + s + `"\} [1-9]`),
		regexp.MustCompile(`(?m)^harvest_pgx_pool_new_connections_total\{shard="` + s + `"\} [1-9]`),
	}
}

// The worker binary serves its instruments at /metrics: claims by queue,
// fairness and outcome, the claim latency histogram (with buckets below
// 10 ms), the queue depth and the shard's unfinished runs, with no label
// that takes a key, a tenant or a run id; and next to them the Go
// runtime, the process, its Postgres pool and its NATS connection. The
// whole page passes promlint.
func TestWorkerMetricsEndpoint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := build(t, "github.com/harvest-run/harvest/cmd/worker")

	dbURL := testsvc.NewDBURL(t)
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	// Two runs of two keys, which the worker claims and completes.
	for i, q := range []string{"m", "m"} {
		key := "customer-" + string(rune('a'+i))
		_, err := runstore.Start(ctx, db, runstore.StartParams{Tenant: "acme", Req: api.StartRequest{
			ID: "run-" + key, Name: "echo", Queue: q, FairnessKey: &key, Input: []byte(`{}`),
		}})
		require.NoError(t, err)
	}

	addr := freeAddr(t)
	run(t, bin,
		"HARVEST_SHARDS="+dbURL,
		"HARVEST_NATS_URL="+testsvc.NATSURL(t),
		"HARVEST_WORKER_QUEUES=m:1",
		"HARVEST_WORKER_FAIRNESS_KEYS=true",
		"HARVEST_WORKER_POLL_INTERVAL=50ms",
		"HARVEST_WORKER_METRICS_ADDR="+addr,
		"HARVEST_WORKER_DEMO_HANDLERS=true", // the runs are echo's
	)

	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^harvest_worker_claims_total\{[^}]*fair="true"[^}]*outcome="ok"[^}]*queue="m"[^}]*\} [1-9]`),
		regexp.MustCompile(`(?m)^harvest_worker_claim_duration_seconds_bucket\{[^}]*queue="m"`),
		regexp.MustCompile(`(?m)^harvest_queue_depth\{[^}]*queue="m"[^}]*shard="0"[^}]*state="pending"[^}]*\} 0`),
		regexp.MustCompile(`(?m)^harvest_runs_unfinished\{[^}]*shard="0"[^}]*\} 0`),
		regexp.MustCompile(`(?m)^harvest_worker_tasks_total\{[^}]*outcome="completed"[^}]*\} 2`),
		regexp.MustCompile(`(?m)^harvest_worker_task_duration_seconds_bucket\{[^}]*le="600"`),
	}
	want = append(want, processSeries...)
	want = append(want, poolSeries(0)...)
	page := scrapeUntil(t, "http://"+addr+"/metrics", want)

	// Bounded labels only: no key, tenant, run id or task id.
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "harvest_") {
			continue
		}
		for _, bad := range []string{"customer-", "acme", "run-", "key=", "tenant=", "run_id="} {
			require.NotContains(t, line, bad, "unbounded label in %q", line)
		}
	}

	// A claim takes milliseconds: the histogram resolves below 10 ms.
	les := leBuckets(t, page, "harvest_worker_claim_duration_seconds")
	require.NotEmpty(t, les)
	require.Less(t, les[0], 0.01, "the claim histogram has no bucket below 10 ms")
	lint(t, page)
}

// The gateway binary's /metrics carries the Go runtime, the process, a
// Postgres pool per shard, its NATS connection and the HTTP server
// metrics of its requests, and passes promlint.
func TestGatewayMetricsEndpoint(t *testing.T) {
	t.Parallel()
	bin := build(t, "github.com/harvest-run/harvest/cmd/gateway")
	shards := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	addr := freeAddr(t)
	run(t, bin,
		"HARVEST_SHARDS="+strings.Join(shards, ","),
		"HARVEST_NATS_URL="+testsvc.NATSURL(t),
		"HARVEST_GATEWAY_ADDR="+addr,
	)
	base := "http://" + addr
	// A request of the API (refused: no token) makes the HTTP metrics.
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/v1/usage")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	}, time.Minute, 100*time.Millisecond, "the gateway does not answer")

	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^http_server_request_duration_seconds_bucket\{[^}]*http_route="/v1/usage"`),
	}
	want = append(want, processSeries...)
	want = append(want, poolSeries(0)...)
	want = append(want, poolSeries(1)...)
	page := scrapeUntil(t, base+"/metrics", want)
	require.NotContains(t, page, `http_route="/metrics"`, "scrapes are measured")
	lint(t, page)
}
