package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Wake is the body of a wake-up: work may be waiting in the queue named by
// the subject. Workers claim as usual; the body carries nothing they need.
type Wake struct {
	// Tasks is how many tasks the sender made claimable, when known.
	Tasks int `json:"tasks,omitempty"`
}

// TenantChanged is the body of a directory change event: the tenant
// whose entry changed and the entry's version after the change, so a
// cache holding that version or a later one reads nothing.
type TenantChanged struct {
	Tenant  string `json:"tenant"`
	Version int64  `json:"version"`
}

// Dispatch names one task row for a worker of the queue group to claim by
// id. The claim still charges the task's key, and a worker claims fairly
// instead when the queue has a backlog.
type Dispatch struct {
	TaskID int64  `json:"task_id"`
	Queue  string `json:"queue"`
}

// WeightEvent says that a weight override or quota of a queue changed; the
// new value is in the database, which stays the only source of truth.
type WeightEvent struct {
	Queue string `json:"queue"`
	Key   string `json:"key"`
	// Kind is "weight" or "quota".
	Kind string `json:"kind"`
}

// propagator carries W3C trace context (and baggage) in NATS headers.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// HeaderCarrier adapts NATS message headers to OpenTelemetry propagation.
type HeaderCarrier nats.Header

// Get returns the first value of a header.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set replaces a header.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// NewMsg makes a JSON message for subject with the trace context of ctx in
// its headers.
func NewMsg(ctx context.Context, subject string, v any) (*nats.Msg, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("dispatch: encode %s: %w", subject, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	propagator.Inject(ctx, HeaderCarrier(msg.Header))
	return msg, nil
}

// Publish sends v as JSON on subject, carrying the trace context of ctx. It
// does not wait for the server: NATS messages are hints, so a lost one costs
// latency only.
//
// When ctx carries a span, the message gets a producer span of its own
// (named by SpanName, with the messaging attributes) and the receivers
// continue that span's trace. Without one, no span is made: background
// publishers (deferred wake-ups, weight fan-out) would otherwise start a
// one-span trace per message.
func Publish(ctx context.Context, nc *nats.Conn, subject string, v any) error {
	return publish(ctx, otel.GetTracerProvider().Tracer(instrumentation), nc, subject, v)
}

// instrumentation names the tracer of the producer spans.
const instrumentation = "github.com/harvest-run/harvest/pkg/dispatch"

func publish(ctx context.Context, tracer trace.Tracer, nc *nats.Conn, subject string, v any) error {
	var span trace.Span
	if trace.SpanContextFromContext(ctx).IsValid() {
		ctx, span = tracer.Start(ctx, SpanName(subject, OperationPublish),
			trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		// The attributes go to a span that records only: without an
		// exporter no span does, and a worker publishes a run event per
		// finished run. (No sampler the environment can name reads
		// attributes, so giving them after the start loses nothing.)
		if span.IsRecording() {
			span.SetAttributes(MessagingAttributes(subject, OperationPublish)...)
		}
	}
	msg, err := NewMsg(ctx, subject, v)
	if err == nil {
		if span != nil {
			span.SetAttributes(semconv.MessagingMessageBodySize(len(msg.Data)))
		}
		if perr := nc.PublishMsg(msg); perr != nil {
			err = fmt.Errorf("dispatch: publish %s: %w", subject, perr)
		}
	}
	if err != nil && span != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// The messaging operations Harvest traces, as messaging.operation.name.
const (
	// OperationPublish is the sending of a message (a producer span).
	OperationPublish = "publish"
	// OperationProcess is the handling of a received message or request
	// (a consumer span, or a server span for a request with a reply).
	OperationProcess = "process"
)

// kinds are the second tokens of Harvest subjects (after the prefix): the
// part of a subject that names what it is for. The tokens after it are
// shards, queues, tenants and run ids.
var kinds = map[string]bool{
	"start": true, "start_batch": true, "wake": true, "dispatch": true,
	"weights": true, "runs": true, "admission": true, "handle": true,
}

// SpanName is the name of a span of operation on subject:
// "<prefix>.<kind> <operation>", such as "harvest.wake publish" for
// "harvest.wake.0.orders". Subjects hold shards, queues, tenants and run
// ids, which would make one span name per run; the name keeps only the
// prefix and the kind (the whole subject is the messaging.destination.name
// attribute). A subject of no known kind gives the operation alone.
func SpanName(subject, operation string) string {
	toks := strings.Split(subject, ".")
	// The prefix has at least one token, so the kind is never the first.
	for i := 1; i < len(toks); i++ {
		if kinds[toks[i]] {
			return strings.Join(toks[:i+1], ".") + " " + operation
		}
	}
	return operation
}

// MessagingAttributes are the OpenTelemetry messaging attributes of a span
// of operation (OperationPublish or OperationProcess) on subject.
func MessagingAttributes(subject, operation string) []attribute.KeyValue {
	typ := semconv.MessagingOperationTypeProcess
	if operation == OperationPublish {
		typ = semconv.MessagingOperationTypeSend
	}
	return []attribute.KeyValue{
		semconv.MessagingSystemKey.String("nats"),
		semconv.MessagingDestinationName(subject),
		semconv.MessagingOperationName(operation),
		typ,
	}
}

// Extract returns ctx with the trace context found in the message headers.
func Extract(ctx context.Context, msg *nats.Msg) context.Context {
	if msg.Header == nil {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(msg.Header))
}
