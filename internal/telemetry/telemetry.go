package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"sync"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
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
	res, err := Resource(ctx, serviceName)
	if err != nil {
		return nil, err
	}

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	exporting := false // whether any span leaves the process
	if tracesExportConfigured() {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
			exporting = true
		}
	}
	if o.stdout != nil {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(o.stdout))
		if err != nil {
			return nil, fmt.Errorf("telemetry: stdout trace exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithSyncer(exp))
		exporting = true
	}
	for _, sp := range o.processors {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(sp))
		exporting = true
	}
	// With nowhere for spans to go, the SDK would record each for nobody.
	var tp interface {
		trace.TracerProvider
		Shutdown(context.Context) error
	} = propagatingProvider{}
	if exporting {
		tp = sdktrace.NewTracerProvider(tpOpts...)
	}

	reg := prometheus.NewRegistry()
	// The process's own figures (Go runtime, file descriptors, memory) and
	// those of the registered pools and NATS connections sit next to the
	// OpenTelemetry instruments on the same page.
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("telemetry: Go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("telemetry: process collector: %w", err)
	}
	if err := reg.Register(poolCollector{}); err != nil {
		return nil, fmt.Errorf("telemetry: pgx pool collector: %w", err)
	}
	if err := reg.Register(natsCollector{}); err != nil {
		return nil, fmt.Errorf("telemetry: NATS collector: %w", err)
	}
	promExp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	if metricsExportConfigured() {
		reader, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			_ = tp.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: metric exporter: %w", err)
		}
		if !autoexport.IsNoneMetricReader(reader) {
			mpOpts = append(mpOpts, sdkmetric.WithReader(reader))
		}
	}
	mp := sdkmetric.NewMeterProvider(mpOpts...)

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

// Resource describes this process to the telemetry back ends. By the
// OpenTelemetry precedence the environment wins: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override what the binary supplies, which is only
// the default: serviceName, the main module's version as service.version
// and a random service.instance.id drawn once per process (so that two
// replicas of one service are told apart).
//
// A malformed OTEL_RESOURCE_ATTRIBUTES does not stop the process: what
// could be read is used, and the error goes to the OpenTelemetry error
// handler.
func Resource(ctx context.Context, serviceName string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		// Detectors merge in order, later ones winning: the defaults
		// first, the environment last.
		resource.WithAttributes(
			attribute.String("service.name", serviceName),
			attribute.String("service.version", serviceVersion()),
			attribute.String("service.instance.id", instanceID()),
		),
		resource.WithFromEnv(),
	)
	if err != nil {
		if res == nil || !errors.Is(err, resource.ErrPartialResource) {
			return nil, fmt.Errorf("telemetry: resource: %w", err)
		}
		otel.Handle(fmt.Errorf("telemetry: resource: %w", err))
	}
	return res, nil
}

// instanceID is this process's service.instance.id: one for the whole
// process, so that Setup after Shared, or a second Setup, keeps it.
var instanceID = sync.OnceValue(uuid.NewString)

// serviceVersion is the main module's version as the go command stamped
// it, or "(devel)" when there is none (go run, tests, builds without
// module information).
func serviceVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Version == "" {
		return "(devel)"
	}
	return bi.Main.Version
}

// tracesExportConfigured reports whether the environment asks for trace
// export. autoexport alone would export to an OTLP collector on localhost
// whenever OTEL_TRACES_EXPORTER is unset; a Harvest binary started without
// any OTEL_* variable exports nothing instead (as before autoexport was
// used), so that a laptop or a CI job without a collector does not log
// failed exports. Naming an exporter (OTEL_TRACES_EXPORTER, "none"
// included) or an OTLP endpoint opts in.
func tracesExportConfigured() bool {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}

// metricsExportConfigured reports whether metrics are pushed as well as
// served at /metrics. Pushing is opt-in through OTEL_METRICS_EXPORTER
// only: an OTLP endpoint set for traces does not start pushing metrics to
// a collector that may not take them. "prometheus" is left out because
// the Prometheus registry of /metrics is always there; autoexport would
// open a second listener for it.
func metricsExportConfigured() bool {
	switch os.Getenv("OTEL_METRICS_EXPORTER") {
	case "", "none", "prometheus":
		return false
	}
	return true
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
