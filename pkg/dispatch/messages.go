package dispatch

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// Wake is the body of a wake-up: work may be waiting in the queue named by
// the subject. Workers claim as usual; the body carries nothing they need.
type Wake struct {
	// Tasks is how many tasks the sender made claimable, when known.
	Tasks int `json:"tasks,omitempty"`
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
func Publish(ctx context.Context, nc *nats.Conn, subject string, v any) error {
	msg, err := NewMsg(ctx, subject, v)
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("dispatch: publish %s: %w", subject, err)
	}
	return nil
}

// Extract returns ctx with the trace context found in the message headers.
func Extract(ctx context.Context, msg *nats.Msg) context.Context {
	if msg.Header == nil {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(msg.Header))
}
