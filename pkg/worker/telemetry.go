package worker

import (
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
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

	// sets holds the label sets already built, by labelKey: building one
	// hashes its attributes, and at thousands of tasks a second that was a
	// tenth of the worker's CPU.
	sets *sync.Map
}

// labelKey names one label set of the worker's metrics; an empty outcome
// is left out of the set.
type labelKey struct {
	queue   string
	fair    bool // only with withFair
	outcome string
	// withFair says whether the set carries the fair label (claim metrics
	// do, task metrics do not).
	withFair bool
}

// labels returns the measurement option of the label set k, built once.
func (in *instruments) labels(k labelKey) metric.MeasurementOption {
	if o, ok := in.sets.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{attribute.String("queue", k.queue)}
	if k.withFair {
		kvs = append(kvs, attribute.Bool("fair", k.fair))
	}
	if k.outcome != "" {
		kvs = append(kvs, attribute.String("outcome", k.outcome))
	}
	o, _ := in.sets.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(kvs...)))
	return o.(metric.MeasurementOption)
}

// claimLabels is the label set of a claim metric of queue q.
func (w *Worker) claimLabels(q, outcome string) metric.MeasurementOption {
	return w.inst.labels(labelKey{queue: q, fair: w.cfg.FairnessKeys, withFair: true, outcome: outcome})
}

// taskLabels is the label set of a task metric of queue q.
func (w *Worker) taskLabels(q, outcome string) metric.MeasurementOption {
	return w.inst.labels(labelKey{queue: q, outcome: outcome})
}

func newInstruments() instruments {
	m := otel.Meter(instrumentation)
	in := instruments{sets: new(sync.Map)}
	in.tracer = otel.Tracer(instrumentation)
	// The constructors only fail on invalid names; the names are fixed.
	in.claims, _ = m.Int64Counter("harvest.worker.claims",
		metric.WithDescription("claims by queue, fairness and outcome"))
	// A claim takes a millisecond or two on a healthy shard, so the
	// buckets start well below 10 ms; the top ones catch lock waits.
	in.claimLatency, _ = m.Float64Histogram("harvest.worker.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("time of one claim statement"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	in.tasks, _ = m.Int64Counter("harvest.worker.tasks",
		metric.WithDescription("task attempts by queue and outcome"))
	// Handlers range from a millisecond (an echo) to minutes (a build),
	// up to ten minutes.
	in.taskDuration, _ = m.Float64Histogram("harvest.worker.task.duration", metric.WithUnit("s"),
		metric.WithDescription("time a handler ran"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
	in.wakeups, _ = m.Int64Counter("harvest.worker.wakeups",
		metric.WithDescription("wake-up messages received"))
	in.running, _ = m.Int64UpDownCounter("harvest.worker.running",
		metric.WithDescription("tasks running in this worker"))
	return in
}
