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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// The worker binary serves its instruments at /metrics: claims by queue,
// fairness and outcome, the claim latency histogram, the queue depth and
// the shard's unfinished runs, with no label that takes a key, a tenant
// or a run id.
func TestWorkerMetricsEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "worker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/harvest-run/harvest/cmd/worker").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

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
	var stderr bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"HARVEST_SHARDS="+dbURL,
		"HARVEST_NATS_URL="+testsvc.NATSURL(t),
		"HARVEST_WORKER_QUEUES=m:1",
		"HARVEST_WORKER_FAIRNESS_KEYS=true",
		"HARVEST_WORKER_POLL_INTERVAL=50ms",
		"HARVEST_WORKER_METRICS_ADDR="+addr,
	)
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("worker stderr:\n%s", &stderr)
		}
	}()

	var page string
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^harvest_worker_claims_total\{[^}]*fair="true"[^}]*outcome="ok"[^}]*queue="m"[^}]*\} [1-9]`),
		regexp.MustCompile(`(?m)^harvest_worker_claim_duration_seconds_bucket\{[^}]*queue="m"`),
		regexp.MustCompile(`(?m)^harvest_queue_depth\{[^}]*queue="m"[^}]*shard="0"[^}]*state="pending"[^}]*\} 0`),
		regexp.MustCompile(`(?m)^harvest_runs_unfinished\{[^}]*shard="0"[^}]*\} 0`),
		regexp.MustCompile(`(?m)^harvest_worker_tasks_total\{[^}]*outcome="completed"[^}]*\} 2`),
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page = string(b)
		for _, re := range want {
			if !re.MatchString(page) {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "instruments missing from /metrics")

	// Bounded labels only: no key, tenant, run id or task id.
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "harvest_") {
			continue
		}
		for _, bad := range []string{"customer-", "acme", "run-", "key=", "tenant=", "run_id="} {
			require.NotContains(t, line, bad, "unbounded label in %q", line)
		}
	}
}
