// Package telemetry sets up OpenTelemetry for every Harvest binary: a
// global tracer provider, the W3C propagator, and a meter provider whose
// figures are served in the Prometheus text format.
//
// Traces leave the process only when the standard OTEL_EXPORTER_OTLP_*
// variables name a collector (OTLP over HTTP), or when the caller asks for
// stdout (harvest dev). Without either, spans are still made, so trace
// context keeps flowing between services, but none is exported.
//
// The package also fixes how a trace context is stored in a database row:
// a JSON object of W3C headers ({"traceparent": "..."}), written by
// InjectJSON at a run's start and read back by SpanContextFromJSON when a
// worker claims the run's task.
package telemetry
