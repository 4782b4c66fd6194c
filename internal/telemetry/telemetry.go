package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Propagator is the context propagation Harvest uses everywhere: W3C trace
// context and baggage.
var Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Option changes what Setup installs.
type Option func(*options)

type options struct {
	stdout     io.Writer
	processors []sdktrace.SpanProcessor
}

// WithSpanProcessor also hands every span to sp (tests pass the span
// recorder of go.opentelemetry.io/otel/sdk/trace/tracetest).
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(o *options) { o.processors = append(o.processors, sp) }
}

// WithStdout also writes every finished span to w as JSON, whatever the
// OTEL_* variables say (harvest dev uses it).
func WithStdout(w io.Writer) Option { return func(o *options) { o.stdout = w } }

// registry holds the Prometheus registry of the last Setup, served by
// MetricsHandler.
var registry struct {
	mu  sync.Mutex
	reg *prometheus.Registry
}

// Setup installs the global tracer provider, propagator and meter provider
// for serviceName. It returns a shutdown function that flushes pending spans;
// call it before the process exits.
//
// After Shared, Setup installs nothing and returns a shutdown that does
// nothing: the providers of Shared stay in force.
func Setup(ctx context.Context, serviceName string, opts ...Option) (shutdown func(context.Context) error, err error) {
	shared.mu.Lock()
	pinned := shared.on
	shared.mu.Unlock()
	if pinned {
		return func(context.Context) error { return nil }, nil
	}
	return setup(ctx, serviceName, opts...)
}

// shared records that Shared installed the process's providers.
var shared struct {
	mu sync.Mutex
	on bool
}

// Shared is Setup for a process that runs several Harvest services at once
// (harvest dev, tests of a whole fleet): it installs the providers for
// serviceName and pins them, so that the Setup calls the embedded gateway
// and workers make keep them instead of replacing them. The returned
// shutdown flushes the spans and unpins the providers.
func Shared(ctx context.Context, serviceName string, opts ...Option) (shutdown func(context.Context) error, err error) {
	inner, err := setup(ctx, serviceName, opts...)
	if err != nil {
		return nil, err
	}
	shared.mu.Lock()
	shared.on = true
	shared.mu.Unlock()
	return func(ctx context.Context) error {
		shared.mu.Lock()
		shared.on = false
		shared.mu.Unlock()
		return inner(ctx)
	}, nil
}

func setup(ctx context.Context, serviceName string, opts ...Option) (shutdown func(context.Context) error, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(attribute.String("service.name", serviceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if otlpConfigured() {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	if o.stdout != nil {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(o.stdout))
		if err != nil {
			return nil, fmt.Errorf("telemetry: stdout trace exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithSyncer(exp))
	}
	for _, sp := range o.processors {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(sp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)

	reg := prometheus.NewRegistry()
	promExp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(promExp))

	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(Propagator)
	registry.mu.Lock()
	registry.reg = reg
	registry.mu.Unlock()

	return func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

// otlpConfigured reports whether the environment names an OTLP endpoint for
// traces.
func otlpConfigured() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// MetricsHandler serves the metrics of the meter provider installed by the
// last Setup in the Prometheus text format (for /metrics). Before any Setup
// it serves an empty page.
func MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		registry.mu.Lock()
		reg := registry.reg
		registry.mu.Unlock()
		if reg == nil {
			reg = prometheus.NewRegistry()
		}
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
}

// InjectJSON returns the trace context of ctx as a JSON object of W3C
// headers, to store with a row; nil when ctx carries no span.
func InjectJSON(ctx context.Context) json.RawMessage {
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	b, err := json.Marshal(carrier)
	if err != nil {
		return nil
	}
	return b
}

// SpanContextFromJSON reads a trace context stored by InjectJSON. Anything
// else (empty, not JSON, no valid traceparent) gives an invalid span
// context, which callers simply do not link to.
func SpanContextFromJSON(raw json.RawMessage) trace.SpanContext {
	if len(raw) == 0 {
		return trace.SpanContext{}
	}
	var carrier propagation.MapCarrier
	if err := json.Unmarshal(raw, &carrier); err != nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), carrier))
}
