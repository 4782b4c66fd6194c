package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// propagatingProvider is the tracer provider of a process that exports no
// span (no exporter, no stdout, no span processor). Its spans record
// nothing, yet each has a span id of its own in its parent's trace, with
// the parent's flags (a root is sampled, as the SDK's default sampler
// would have it), so trace context flows between services exactly as when
// the spans are recorded: a service downstream that does export sees the
// same trace and sampling decision either way.
//
// The SDK's provider records every span even with no processor to hand it
// to (names, attributes, events, timestamps), and in a worker draining a
// flood that cost about a tenth of its CPU for spans nobody would read.
type propagatingProvider struct{ embedded.TracerProvider }

func (propagatingProvider) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return propagatingTracer{}
}

// Shutdown has nothing to flush.
func (propagatingProvider) Shutdown(context.Context) error { return nil }

type propagatingTracer struct{ embedded.Tracer }

func (propagatingTracer) Start(ctx context.Context, _ string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	if cfg := trace.NewSpanStartConfig(opts...); cfg.NewRoot() {
		parent = trace.SpanContext{}
	}
	scc := trace.SpanContextConfig{
		TraceID:    parent.TraceID(),
		SpanID:     newSpanID(),
		TraceFlags: parent.TraceFlags(),
		TraceState: parent.TraceState(),
	}
	if !parent.IsValid() {
		scc.TraceID, scc.TraceFlags = newTraceID(), trace.FlagsSampled
	}
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(scc))
	return ctx, trace.SpanFromContext(ctx)
}

// newSpanID and newTraceID draw ids from the runtime's generator, which
// is safe for concurrent use and seeded at random; an id is never zero
// (zero is not a valid id).
func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}
