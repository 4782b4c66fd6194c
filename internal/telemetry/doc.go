// Package telemetry sets up OpenTelemetry for every Harvest binary: a
// global tracer provider, the W3C propagator, and a meter provider whose
// figures are served in the Prometheus text format.
//
// Traces leave the process only when the environment asks for it
// (OTEL_TRACES_EXPORTER, or an OTLP endpoint in OTEL_EXPORTER_OTLP_*; the
// protocol follows OTEL_EXPORTER_OTLP_PROTOCOL), or when the caller asks
// for stdout (harvest dev). Without either, spans record nothing, yet each
// has its own id in its parent's trace with its parent's sampling flag, so
// trace context keeps flowing between services as if they were recorded
// (propagate.go). Metrics
// are always served in the Prometheus text format (with the Go runtime,
// process, Postgres pool and NATS connection figures) and are also pushed
// when OTEL_METRICS_EXPORTER names an exporter. OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override the service name the binary gives.
//
// The package also fixes how a trace context is stored in a database row:
// a JSON object of W3C headers ({"traceparent": "..."}), written by
// InjectJSON at a run's start and read back by SpanContextFromJSON when a
// worker claims the run's task.
package telemetry
