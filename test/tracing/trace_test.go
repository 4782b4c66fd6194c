package tracing

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/internal/workerbin"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/worker"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// One start over HTTP, claimed and run by a fair worker of the tenant's
// home shard, makes one trace: the gateway's start span is the root; the
// worker's claim and execution spans are its children (through the trace
// context stored on the task), the execution links to the claim, and the
// worker's Postgres statements hang below them without their SQL text.
// With the worker's defaults (batch claims) the claim statement serves many
// runs: it has a span of the worker's own, with its Postgres spans, which
// the run's claim span links to; with one claim per task (ClaimBatch 1) the
// statement runs outside any span (an idle loop's empty polls would bury
// the traces that matter) and returns the run with the task, so the run's
// claim span is made from its outcome and links to nothing.
// Not parallel: it installs the process's tracer provider.
func TestOneTraceFromStartToExecution(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	shutdown, err := telemetry.Shared(context.Background(), "trace-test", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	for _, batch := range []int{worker.DefaultConfig().ClaimBatch, 1} {
		t.Run(fmt.Sprintf("claim batch %d", batch), func(t *testing.T) { traceOneRun(t, rec, batch) })
	}
}

func traceOneRun(t *testing.T, rec *tracetest.SpanRecorder, batch int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	shardURLs := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	natsURL := testsvc.NATSURL(t)
	gnc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(gnc.Close)

	g := newGateway(t, shardURLs, gnc, natsURL)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)

	home := shards.Home(tenant, len(shardURLs))
	pcfg, err := pgxpool.ParseConfig(shardURLs[home])
	require.NoError(t, err)
	telemetry.PoolConfig(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	wnc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(wnc.Close)
	wcfg := worker.DefaultConfig()
	wcfg.Shard = home
	wcfg.FairnessKeys = true
	wcfg.ID = "trace-worker"
	wcfg.ClaimBatch = batch
	wcfg.RunJanitor = false
	finished := make(chan worker.Outcome, 10)
	w, err := worker.New(pool, wcfg, worker.Options{NATS: wnc, Logger: quiet, Hooks: worker.Hooks{
		Finished: func(_ worker.Task, o worker.Outcome, _ error) { finished <- o },
	}})
	require.NoError(t, err)
	workerbin.RegisterDemo(w)
	wctx, stopWorker := context.WithCancel(ctx)
	var runErr error
	stopped := make(chan struct{})
	go func() { runErr = w.Run(wctx); close(stopped) }()
	t.Cleanup(func() { stopWorker(); <-stopped })
	<-w.Ready()

	c, err := client.New(client.Options{URL: srv.URL, Token: secret})
	require.NoError(t, err)
	st, err := c.Start(ctx, "echo", "default", map[string]int{"n": 1}, client.StartOptions{FairnessKey: "customer-7"})
	require.NoError(t, err)
	select {
	case o := <-finished:
		require.Equal(t, worker.OutcomeCompleted, o)
	case <-ctx.Done():
		t.Fatal("the run was not executed")
	}
	run, err := c.Wait(ctx, st.Run.ID, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, run.Status)

	stopWorker()
	<-stopped
	require.NoError(t, runErr)
	var start, claimSpan, exec sdktrace.ReadOnlySpan
	spans := rec.Ended()
	for _, s := range spans {
		a := attrs(s)
		switch s.Name() {
		case "harvest.start":
			if a["harvest.run_id"].AsString() == st.Run.ID {
				start = s
			}
		case "harvest.claim":
			if a["harvest.run_id"].AsString() == st.Run.ID {
				claimSpan = s
			}
		case "harvest.execute":
			if a["harvest.run_id"].AsString() == st.Run.ID {
				exec = s
			}
		}
	}
	require.NotNil(t, start, "no start span")
	require.NotNil(t, claimSpan, "no claim span")
	require.NotNil(t, exec, "no execution span")

	// One trace, rooted at the start.
	trace := start.SpanContext().TraceID()
	require.False(t, start.Parent().IsValid(), "the start span is the root")
	require.Equal(t, trace, claimSpan.SpanContext().TraceID(), "claim span in the start's trace")
	require.Equal(t, trace, exec.SpanContext().TraceID(), "execution span in the start's trace")
	require.Equal(t, start.SpanContext().SpanID(), claimSpan.Parent().SpanID())
	require.Equal(t, start.SpanContext().SpanID(), exec.Parent().SpanID())
	require.Len(t, exec.Links(), 1)
	require.Equal(t, claimSpan.SpanContext().SpanID(), exec.Links()[0].SpanContext.SpanID())
	require.False(t, claimSpan.StartTime().After(exec.StartTime()))

	// Key, queue, shard and lag.
	sa, ca, ea := attrs(start), attrs(claimSpan), attrs(exec)
	for name, a := range map[string]map[attribute.Key]attribute.Value{"start": sa, "claim": ca, "execute": ea} {
		require.Equal(t, "default", a["harvest.queue"].AsString(), name)
		require.Equal(t, int64(home), a["harvest.shard"].AsInt64(), name)
		require.Equal(t, "acme/customer-7", a["harvest.fairness_key"].AsString(), name) // bound to the tenant by default
	}
	_, hasLag := ca["harvest.claim.lag"]
	require.True(t, hasLag, "claim span without lag")
	require.True(t, ca["harvest.fair"].AsBool())
	require.Equal(t, "ok", ca["harvest.claim.outcome"].AsString())

	// Every span of the trace is connected to the root through its parents.
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.SpanContext().TraceID() == trace {
			byID[s.SpanContext().SpanID().String()] = s
		}
	}
	dbSpans := 0
	for _, s := range byID {
		if _, ok := attrs(s)["db.system.name"]; ok {
			dbSpans++
		}
		p := s
		for p.Parent().IsValid() {
			parent, ok := byID[p.Parent().SpanID().String()]
			require.True(t, ok, "span %s: parent %s not in the trace", s.Name(), p.Parent().SpanID())
			p = parent
		}
		require.Equal(t, start.SpanContext().SpanID(), p.SpanContext().SpanID(), "span %s not under the start", s.Name())
	}
	if batch == 1 {
		require.Empty(t, claimSpan.Links(), "a single claim's span links to a batch")
		require.Zero(t, dbSpans, "the worker read the database in the run's trace before running it")
	} else {
		// The claim span links to the batch statement's span, which has
		// the statement's Postgres spans below it.
		links := claimSpan.Links()
		require.Len(t, links, 1, "the claim span links to its batch")
		batchID := links[0].SpanContext.SpanID()
		var batchSpan sdktrace.ReadOnlySpan
		below := 0
		for _, s := range spans {
			if s.SpanContext().SpanID() == batchID {
				batchSpan = s
			}
			if _, ok := attrs(s)["db.system.name"]; ok && s.Parent().SpanID() == batchID {
				below++
			}
		}
		require.NotNil(t, batchSpan, "the linked batch span was recorded")
		require.Equal(t, "harvest.claim_batch", batchSpan.Name())
		require.Contains(t, attrs(batchSpan), attribute.Key("harvest.claim.shallow"), "the batch span says whether it took single steps first")
		require.Positive(t, below, "no Postgres span below the batch span")
	}

	// No span of the process carries SQL text.
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "db.query.text", "db.statement", "pgx.query.parameters":
				t.Errorf("span %q (scope %s) carries %s", s.Name(), s.InstrumentationScope().Name, kv.Key)
			}
		}
	}
}

// The tenant and bearer secret of the gateways newGateway makes.
const tenant, secret = "acme", "acme-secret"

// newGateway makes a gateway over shardURLs whose one token lets tenant
// start and read runs with secret, closed when the test ends.
func newGateway(t *testing.T, shardURLs []string, nc *nats.Conn, natsURL string) *gateway.Gateway {
	t.Helper()
	set, err := auth.ParseTokens([]byte(`[{"name":"acme-ci","tenant":"` + tenant + `","sha256":"` + auth.HashSecret(secret) +
		`","privileges":["runs:start","runs:read"]}]`))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: gateway.DefaultConfig(shardURLs, natsURL), Tokens: auth.NewStore(set),
		NATS: nc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: telemetry.MetricsHandler()})
	require.NoError(t, err)
	t.Cleanup(g.Close)
	return g
}
