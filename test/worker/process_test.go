package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/pkg/api"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// build compiles cmd/worker into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/harvest-run/harvest/cmd/worker")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// bundle is a shard, a NATS server, a connection to it and the binary.
type bundle struct {
	t     *testing.T
	ctx   context.Context
	bin   string
	dbURL string
	db    *pgxpool.Pool
	nats  string
	nc    *nats.Conn
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b := &bundle{t: t, ctx: ctx, bin: build(t), dbURL: testsvc.NewDBURL(t), nats: testsvc.NATSURL(t)}
	db, err := pgxpool.New(ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	b.db = db
	nc, err := nats.Connect(b.nats)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	b.nc = nc
	return b
}

// proc is a running worker process.
type proc struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is the test workers' environment: short leases and heartbeats, a
// fast janitor, polling as the fallback.
func (b *bundle) env(id string, extra ...string) []string {
	return append(append(os.Environ(),
		"HARVEST_SHARDS="+b.dbURL,
		"HARVEST_NATS_URL="+b.nats,
		"HARVEST_WORKER_QUEUES=q:1",
		"HARVEST_WORKER_ID="+id,
		"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS=2",
		"HARVEST_WORKER_LEASE=1s",
		"HARVEST_WORKER_HEARTBEAT_INTERVAL=200ms",
		"HARVEST_WORKER_POLL_INTERVAL=50ms",
		"HARVEST_WORKER_JANITOR_INTERVAL=100ms",
		"HARVEST_WORKER_RETRY_BASE=10ms",
		"HARVEST_WORKER_RETRY_MAX=20ms",
		"HARVEST_WORKER_METRICS_ADDR=",
	), extra...)
}

func (b *bundle) spawn(id string, extra ...string) *proc {
	b.t.Helper()
	p := &proc{cmd: exec.Command(b.bin), stderr: &lockedBuffer{}, done: make(chan error, 1)}
	p.cmd.Env = b.env(id, extra...)
	p.cmd.Stderr = p.stderr
	require.NoError(b.t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	b.t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
		if b.t.Failed() {
			b.t.Logf("worker %s stderr:\n%s", id, p.stderr.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, ctx context.Context) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		if err == nil {
			return 0
		}
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		return ee.ExitCode()
	case <-ctx.Done():
		t.Fatal("worker process did not exit")
		return -1
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// handler serves workflow "block" over the bridge: every request is handed
// to the test, which decides when (and whether) to reply.
func (b *bundle) handler() chan *nats.Msg {
	b.t.Helper()
	ch := make(chan *nats.Msg, 16)
	sub, err := b.nc.ChanSubscribe("harvest.handle.block", ch)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(b.t, b.nc.Flush())
	return ch
}

func (b *bundle) request(ch chan *nats.Msg) (*nats.Msg, workerbin.BridgeRequest) {
	b.t.Helper()
	select {
	case m := <-ch:
		var req workerbin.BridgeRequest
		require.NoError(b.t, json.Unmarshal(m.Data, &req))
		return m, req
	case <-b.ctx.Done():
		b.t.Fatal("no bridge request arrived")
		return nil, workerbin.BridgeRequest{}
	}
}

func (b *bundle) start(name, input string) runstore.StartResult {
	b.t.Helper()
	res, err := runstore.Start(b.ctx, b.db, runstore.StartParams{Tenant: "acme", Req: api.StartRequest{
		// Announced, so that a test can count the run's final events.
		ID: testsvc.RandomName("run-"), Name: name, Queue: "q", Input: json.RawMessage(input), Notify: true,
	}})
	require.NoError(b.t, err)
	return res
}

func (b *bundle) run(id string) api.Run {
	b.t.Helper()
	r, err := runstore.Get(b.ctx, b.db, "acme", id, 0)
	require.NoError(b.t, err)
	return r
}

func reply(t *testing.T, m *nats.Msg, output string) {
	t.Helper()
	body, err := json.Marshal(workerbin.BridgeReply{Output: json.RawMessage(output)})
	require.NoError(t, err)
	require.NoError(t, m.Respond(body))
}

func TestHelpListsEveryVariable(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(build(t), "--help").Output()
	require.NoError(t, err)
	for _, v := range []string{"HARVEST_SHARDS", "HARVEST_NATS_URL", "HARVEST_WORKER_SHARD", "HARVEST_WORKER_QUEUES",
		"HARVEST_WORKER_FAIRNESS_KEYS", "HARVEST_WORKER_MAX_CONCURRENT_CLAIMS", "HARVEST_WORKER_PRIORITY_AGING_SECS",
		"HARVEST_WORKER_POLL_INTERVAL", "HARVEST_WORKER_LEASE", "HARVEST_WORKER_HEARTBEAT_INTERVAL",
		"HARVEST_WORKER_SHUTDOWN_GRACE", "HARVEST_WORKER_ID", "HARVEST_WORKER_METRICS_ADDR", "HARVEST_RETENTION",
		"HARVEST_RATE_BUCKET_GC", "HARVEST_RATE_BUCKET_IDLE_WINDOW", "HARVEST_WORKER_HANDLE_TIMEOUT"} {
		require.Contains(t, string(out), v)
	}
}

func TestFairWorkerRefusesABadQueueName(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(build(t))
	cmd.Env = append(os.Environ(), "HARVEST_SHARDS=postgres://127.0.0.1:1/x",
		"HARVEST_WORKER_QUEUES=good:1,..:1", "HARVEST_WORKER_FAIRNESS_KEYS=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, stderr.String(), `HARVEST_WORKER_QUEUES: queue ".."`)
}

func TestKilledMidTaskIsRescuedAndCompletesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requests := b.handler()
	events, err := b.nc.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)

	a := b.spawn("a")
	st := b.start("block", `{"n":1}`)
	_, first := b.request(requests)
	require.Equal(t, st.TaskID, first.TaskID)
	require.Equal(t, 1, first.Attempt)
	a.signal(t, syscall.SIGKILL)
	a.wait(t, b.ctx)

	// Another worker's janitor rescues the task once the lease is over
	// (database clock), and the worker runs it again.
	w2 := b.spawn("b")
	m, second := b.request(requests)
	require.Equal(t, st.TaskID, second.TaskID)
	require.Equal(t, 2, second.Attempt)
	reply(t, m, `"from b"`)

	ev, err := events.NextMsg(time.Minute)
	require.NoError(t, err)
	var run api.Run
	require.NoError(t, json.Unmarshal(ev.Data, &run))
	require.Equal(t, api.StatusCompleted, run.Status)

	w2.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, w2.wait(t, b.ctx))
	require.NoError(t, b.nc.Flush())
	_, err = events.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "the run completed once")
	run = b.run(st.Run.ID)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `"from b"`, string(run.Output))
	require.Equal(t, 2, run.Attempts)
	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 'acme'`).Scan(&running))
	require.Zero(t, running)
}

func TestPausedPastLeaseCannotComplete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requests := b.handler()
	a := b.spawn("a")
	st := b.start("block", `{}`)
	mA, first := b.request(requests)
	require.Equal(t, 1, first.Attempt)
	a.signal(t, syscall.SIGSTOP)

	w2 := b.spawn("b")
	mB, second := b.request(requests)
	require.Equal(t, st.TaskID, second.TaskID)
	require.Equal(t, 2, second.Attempt)
	reply(t, mB, `"from b"`)

	// Resumed, the first worker gets its reply too, but its lease is void.
	a.signal(t, syscall.SIGCONT)
	reply(t, mA, `"from a"`)
	a.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, a.wait(t, b.ctx))
	w2.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, w2.wait(t, b.ctx))

	run := b.run(st.Run.ID)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `"from b"`, string(run.Output))
	require.Equal(t, 2, run.Attempts)
}

func TestTerminatedWithTasksInFlightLeavesNothingRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requests := b.handler()
	w := b.spawn("a", "HARVEST_WORKER_SHUTDOWN_GRACE=100ms", "HARVEST_WORKER_JANITOR=false")
	one := b.start("block", `{}`)
	two := b.start("block", `{}`)
	b.request(requests)
	b.request(requests)

	w.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, w.wait(t, b.ctx))
	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE state = 'running'`).Scan(&running))
	require.Zero(t, running)
	for _, st := range []runstore.StartResult{one, two} {
		run := b.run(st.Run.ID)
		require.Equal(t, api.StatusQueued, run.Status)
		require.Zero(t, run.Attempts)
	}
	require.True(t, strings.Contains(w.stderr.String(), "worker stopped"), w.stderr.String())
}
