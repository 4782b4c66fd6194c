package telemetry

import (
	"context"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// PoolConfig makes every statement of pools built from cfg traced, the way
// all Harvest binaries trace Postgres:
//
//   - The SQL text and the query parameters stay out of the span
//     attributes (they may carry tenants' data); spans are named by the
//     SQL operation (SELECT, INSERT, ...) and keep the connection details.
//   - A statement is traced only inside a span of Harvest's own (a start,
//     a claim, an execution). Statements made outside any span, such as
//     idle workers' polls and background bookkeeping, make no span, so
//     they do not flood the trace viewer with one-span traces.
//   - Spans go to the tracer provider installed at the time of the call
//     (telemetry.Setup or otel.SetTracerProvider), not the one at the time
//     the pool was made.
//
// Call it on the parsed configuration before pgxpool.NewWithConfig.
func PoolConfig(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(
		otelpgx.WithTracerProvider(childOnlyProvider{}),
		otelpgx.WithDisableSQLStatementInAttributes(),
	)
}

// childOnlyProvider hands out tracers that start a span only when the
// context already holds a valid span, and otherwise return the context
// unchanged with a non-recording span.
type childOnlyProvider struct{ embedded.TracerProvider }

func (childOnlyProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{name: name, opts: opts}
}

type childOnlyTracer struct {
	embedded.Tracer
	name string
	opts []trace.TracerOption
}

var noopSpan = func() trace.Span {
	_, s := noop.NewTracerProvider().Tracer("").Start(context.Background(), "")
	return s
}()

func (t childOnlyTracer) Start(ctx context.Context, spanName string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noopSpan
	}
	return otel.GetTracerProvider().Tracer(t.name, t.opts...).Start(ctx, spanName, opts...)
}
