package worker

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/harvest-run/harvest/pkg/worker"

// instruments are the worker's metrics. Labels are bounded: queue names
// come from the worker's configuration, never from callers' keys, tenants
// or run ids (those go on spans).
type instruments struct {
	tracer       trace.Tracer
	claims       metric.Int64Counter
	claimLatency metric.Float64Histogram
	tasks        metric.Int64Counter
	taskDuration metric.Float64Histogram
	wakeups      metric.Int64Counter
	running      metric.Int64UpDownCounter
}

func newInstruments() instruments {
	m := otel.Meter(instrumentation)
	var in instruments
	in.tracer = otel.Tracer(instrumentation)
	// The constructors only fail on invalid names; the names are fixed.
	in.claims, _ = m.Int64Counter("harvest.worker.claims",
		metric.WithDescription("claims by queue, fairness and outcome"))
	in.claimLatency, _ = m.Float64Histogram("harvest.worker.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("time of one claim statement"))
	in.tasks, _ = m.Int64Counter("harvest.worker.tasks",
		metric.WithDescription("task attempts by queue and outcome"))
	in.taskDuration, _ = m.Float64Histogram("harvest.worker.task.duration", metric.WithUnit("s"),
		metric.WithDescription("time a handler ran"))
	in.wakeups, _ = m.Int64Counter("harvest.worker.wakeups",
		metric.WithDescription("wake-up messages received"))
	in.running, _ = m.Int64UpDownCounter("harvest.worker.running",
		metric.WithDescription("tasks running in this worker"))
	return in
}
