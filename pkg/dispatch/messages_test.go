package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/natsembed"
)

func TestPublishCarriesTraceContext(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	sub, err := nc.SubscribeSync(Subjects{}.Dispatch(0, "orders.eu"))
	require.NoError(t, err)

	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	require.NoError(t, Publish(ctx, nc, Subjects{}.Dispatch(0, "orders.eu"), Dispatch{TaskID: 7, Queue: "orders.eu"}))
	msg, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.JSONEq(t, `{"task_id":7,"queue":"orders.eu"}`, string(msg.Data))
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", msg.Header.Get("traceparent"))

	got := trace.SpanContextFromContext(Extract(context.Background(), msg))
	require.Equal(t, tid, got.TraceID())
	require.True(t, got.IsRemote())
}

func TestExtractWithoutHeaders(t *testing.T) {
	t.Parallel()
	ctx := Extract(context.Background(), &nats.Msg{})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
}
