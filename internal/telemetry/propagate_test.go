package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/telemetry"
)

// With nothing to export to, spans record nothing but still carry trace
// context: a child keeps its parent's trace and sampling flag under a
// span id of its own, a root is a new sampled trace, and the context goes
// into a row and back. Not parallel: Setup installs process-wide providers.
func TestSetupWithoutExportPropagatesWithoutRecording(t *testing.T) {
	noExportEnv(t)
	shutdown, err := telemetry.Setup(context.Background(), "test-service")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, shutdown(context.Background())) })
	tracer := otel.Tracer("test")

	ctx, root := tracer.Start(context.Background(), "root")
	require.False(t, root.IsRecording(), "a span with nowhere to go is recorded")
	rsc := root.SpanContext()
	require.True(t, rsc.IsValid())
	require.True(t, rsc.IsSampled(), "a root is sampled, as the SDK's default sampler has it")

	_, child := tracer.Start(ctx, "child")
	csc := child.SpanContext()
	require.Equal(t, rsc.TraceID(), csc.TraceID())
	require.NotEqual(t, rsc.SpanID(), csc.SpanID())
	require.True(t, csc.IsSampled())

	stored := telemetry.InjectJSON(ctx)
	back := telemetry.SpanContextFromJSON(stored)
	require.Equal(t, rsc.TraceID(), back.TraceID())
	require.Equal(t, rsc.SpanID(), back.SpanID())

	// An upstream decision not to sample is kept.
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: rsc.TraceID(), SpanID: rsc.SpanID(), Remote: true})
	_, under := tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), unsampled), "under")
	require.Equal(t, rsc.TraceID(), under.SpanContext().TraceID())
	require.False(t, under.SpanContext().IsSampled())

	_, fresh := tracer.Start(ctx, "fresh", trace.WithNewRoot())
	require.NotEqual(t, rsc.TraceID(), fresh.SpanContext().TraceID())
	require.True(t, fresh.SpanContext().IsValid())
}
