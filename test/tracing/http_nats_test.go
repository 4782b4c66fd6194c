package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// The gateway's server (Server, as the binary serves it) traces HTTP: a
// start over HTTP makes a server span named by its route, with
// http.route, whose child is the start span, whose child in turn is the
// producer span of the wake-up with the messaging attributes. A start over
// NATS makes a server span for the request, with the messaging attributes,
// above its start span. Probes and scrapes make no span. Not parallel: it
// installs the process's tracer provider.
func TestHTTPAndNATSStartSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	shutdown, err := telemetry.Shared(context.Background(), "trace-test", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	natsURL := testsvc.NATSURL(t)
	gnc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(gnc.Close)
	g := newGateway(t, []string{testsvc.NewDBURL(t)}, gnc, natsURL)
	require.NoError(t, g.ServeNATS())
	srv := httptest.NewServer(g.Server().Handler)
	t.Cleanup(srv.Close)

	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
	}

	c, err := client.New(client.Options{URL: srv.URL, Token: secret})
	require.NoError(t, err)
	st, err := c.Start(ctx, "echo", "default", map[string]int{"n": 1}, client.StartOptions{})
	require.NoError(t, err)

	cnc, err := nats.Connect(natsURL, nats.CustomInboxPrefix(natsauth.InboxPrefix(tenant)))
	require.NoError(t, err)
	t.Cleanup(cnc.Close)
	nclient, err := client.New(client.Options{NATS: cnc, Tenant: tenant})
	require.NoError(t, err)
	nst, err := nclient.Start(ctx, "echo", "default", map[string]int{"n": 2}, client.StartOptions{})
	require.NoError(t, err)

	startOf := func(runID string) sdktrace.ReadOnlySpan {
		for _, s := range rec.Ended() {
			if s.Name() == "harvest.start" && attrs(s)["harvest.run_id"].AsString() == runID {
				return s
			}
		}
		return nil
	}
	byID := func(id trace.SpanID) sdktrace.ReadOnlySpan {
		for _, s := range rec.Ended() {
			if s.SpanContext().SpanID() == id {
				return s
			}
		}
		return nil
	}
	// The spans of a start end around its answer, the producer's after
	// the commit: wait for the ones looked at.
	var start, httpSpan, wake sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		if start = startOf(st.Run.ID); start == nil {
			return false
		}
		if httpSpan = byID(start.Parent().SpanID()); httpSpan == nil {
			return false
		}
		wake = nil
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindProducer && s.Parent().SpanID() == start.SpanContext().SpanID() &&
				s.Name() == "harvest.wake publish" {
				wake = s
			}
		}
		return wake != nil
	}, 30*time.Second, 20*time.Millisecond, "no HTTP span above the start span, or no wake-up producer span below it")

	require.Equal(t, "POST /v1/runs", httpSpan.Name())
	require.Equal(t, trace.SpanKindServer, httpSpan.SpanKind())
	require.Equal(t, trace.SpanKindInternal, start.SpanKind(), "the start sits under the server's span")
	require.Equal(t, "/v1/runs", attrs(httpSpan)["http.route"].AsString())
	require.False(t, httpSpan.Parent().IsValid(), "the HTTP span is the root")
	require.Equal(t, httpSpan.SpanContext().TraceID(), start.SpanContext().TraceID())

	wa := attrs(wake)
	require.Equal(t, "nats", wa["messaging.system"].AsString())
	require.Equal(t, dispatch.Subjects{}.Wake(0, "default"), wa["messaging.destination.name"].AsString())
	require.Equal(t, "send", wa["messaging.operation.type"].AsString())
	require.Equal(t, start.SpanContext().TraceID(), wake.SpanContext().TraceID())

	var nstart, natsSpan sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		if nstart = startOf(nst.Run.ID); nstart == nil {
			return false
		}
		natsSpan = byID(nstart.Parent().SpanID())
		return natsSpan != nil
	}, 30*time.Second, 20*time.Millisecond, "no NATS span above the NATS start's span")
	require.Equal(t, "harvest.start process", natsSpan.Name())
	require.Equal(t, trace.SpanKindServer, natsSpan.SpanKind(), "a request with a reply is served")
	na := attrs(natsSpan)
	require.Equal(t, "nats", na["messaging.system"].AsString())
	require.Equal(t, dispatch.Subjects{}.Start(tenant), na["messaging.destination.name"].AsString())
	require.Equal(t, "process", na["messaging.operation.type"].AsString())
	require.Equal(t, gateway.DefaultConfig(nil, "").QueueGroup, na["messaging.consumer.group.name"].AsString())
	require.Equal(t, int64(201), na["harvest.status"].AsInt64())

	for _, s := range rec.Ended() {
		if s.InstrumentationScope().Name != "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp" {
			continue
		}
		route := attrs(s)["http.route"].AsString()
		require.NotContains(t, []string{"/healthz", "/readyz", "/metrics"}, route, "probes and scrapes are traced")
		// Span names are bounded: the route, never the path with an id.
		require.NotContains(t, s.Name(), st.Run.ID)
	}
}
