package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/natsembed"
)

func TestSpanNameKeepsOnlyPrefixAndKind(t *testing.T) {
	t.Parallel()
	s := Subjects{}
	for subject, want := range map[string]string{
		s.Wake(3, "orders.eu"):                   "harvest.wake publish",
		s.Dispatch(0, "q"):                       "harvest.dispatch publish",
		s.Runs("acme", "run-1"):                  "harvest.runs publish",
		s.Start("acme"):                          "harvest.start publish",
		s.StartBatch("acme"):                     "harvest.start_batch publish",
		s.Weights("q"):                           "harvest.weights publish",
		s.Admission():                            "harvest.admission publish",
		Subjects{Prefix: "eu.prod"}.Wake(1, "q"): "eu.prod.wake publish",
		"somewhere.else":                         "publish",
	} {
		require.Equal(t, want, SpanName(subject, OperationPublish), subject)
	}
}

// Inside a span, Publish makes a producer span below it, with the
// messaging attributes, and the message carries the producer span's
// context; outside any span it makes none and the message carries none.
func TestPublishMakesProducerSpanInsideASpan(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")

	subject := Subjects{}.Wake(2, "orders.eu")
	sub, err := nc.SubscribeSync(subject)
	require.NoError(t, err)

	require.NoError(t, publish(context.Background(), tracer, nc, subject, Wake{Tasks: 1}))
	msg, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get("traceparent"))
	require.Empty(t, rec.Ended(), "a publish outside any span made a span")

	ctx, parent := tracer.Start(context.Background(), "parent")
	require.NoError(t, publish(ctx, tracer, nc, subject, Wake{Tasks: 2}))
	parent.End()
	msg, err = sub.NextMsg(5 * time.Second)
	require.NoError(t, err)

	var producer sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			producer = s
		}
	}
	require.NotNil(t, producer, "no producer span")
	require.Equal(t, "harvest.wake publish", producer.Name())
	require.Equal(t, parent.SpanContext().SpanID(), producer.Parent().SpanID())
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range producer.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	require.Equal(t, "nats", attrs["messaging.system"].AsString())
	require.Equal(t, subject, attrs["messaging.destination.name"].AsString())
	require.Equal(t, "send", attrs["messaging.operation.type"].AsString())
	require.Equal(t, "publish", attrs["messaging.operation.name"].AsString())
	require.Equal(t, int64(len(msg.Data)), attrs["messaging.message.body.size"].AsInt64())

	got := trace.SpanContextFromContext(Extract(context.Background(), msg))
	require.Equal(t, producer.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, producer.SpanContext().SpanID(), got.SpanID(), "the receivers continue the producer span")
}
