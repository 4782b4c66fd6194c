package workerbin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

// BridgeRequest is the body the bridge sends on harvest.handle.<workflow>.
type BridgeRequest struct {
	TaskID      int64           `json:"task_id"`
	RunID       string          `json:"run_id"`
	Tenant      string          `json:"tenant"`
	Workflow    string          `json:"workflow"`
	Queue       string          `json:"queue"`
	Shard       int             `json:"shard"`
	FairnessKey string          `json:"fairness_key"`
	Step        int             `json:"step"`
	Attempt     int             `json:"attempt"`
	MaxAttempts int             `json:"max_attempts"`
	Input       json.RawMessage `json:"input,omitempty"`
	// Deadline is when the worker stops waiting for the reply.
	Deadline api.Time `json:"deadline"`
}

// BridgeReply is what a service answers. Exactly one of Output (the run
// completes; absent means null), Continue or Error should be set.
type BridgeReply struct {
	Output   json.RawMessage `json:"output,omitempty"`
	Continue *BridgeNext     `json:"continue,omitempty"`
	// Error fails the attempt; it is retried unless Permanent is true.
	Error     string `json:"error,omitempty"`
	Permanent bool   `json:"permanent,omitempty"`
}

// BridgeNext asks for a further step of the run.
type BridgeNext struct {
	Input json.RawMessage `json:"input,omitempty"`
	Delay api.Duration    `json:"delay,omitempty"`
}

// Bridge runs a task by asking a service over NATS request-reply. A
// timeout or the absence of any responder fails the attempt, which is
// then retried like any failure.
type Bridge struct {
	NC       *nats.Conn
	Subjects dispatch.Subjects
	// Timeout bounds the wait for a reply; the run's own timeout, when
	// shorter, wins.
	Timeout time.Duration
}

// Handle implements worker.Handler.
func (b Bridge) Handle(ctx context.Context, t worker.Task) (worker.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	req := BridgeRequest{
		TaskID: t.ID, RunID: t.RunID, Tenant: t.Tenant, Workflow: t.Workflow, Queue: t.Queue, Shard: t.Shard,
		FairnessKey: t.Key, Step: t.Step, Attempt: t.Attempt, MaxAttempts: t.MaxAttempts, Input: t.Input,
		Deadline: api.Time{Time: deadline},
	}
	msg, err := dispatch.NewMsg(ctx, b.Subjects.Handle(t.Workflow), req)
	if err != nil {
		return worker.Result{}, err
	}
	resp, err := b.NC.RequestMsgWithContext(ctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return worker.Result{}, fmt.Errorf("no service answers on %s", msg.Subject)
	case errors.Is(err, context.DeadlineExceeded) && context.Cause(ctx) == context.DeadlineExceeded:
		return worker.Result{}, fmt.Errorf("no reply on %s within %s", msg.Subject, b.Timeout)
	case err != nil:
		if cause := context.Cause(ctx); cause != nil {
			return worker.Result{}, cause
		}
		return worker.Result{}, fmt.Errorf("request on %s: %w", msg.Subject, err)
	}
	var reply BridgeReply
	if err := json.Unmarshal(resp.Data, &reply); err != nil {
		return worker.Result{}, fmt.Errorf("reply on %s is not a bridge reply: %w", msg.Subject, err)
	}
	switch {
	case reply.Error != "" && reply.Permanent:
		return worker.Result{}, worker.Permanent(errors.New(reply.Error))
	case reply.Error != "":
		return worker.Result{}, errors.New(reply.Error)
	case reply.Continue != nil:
		return worker.Result{Next: &worker.Next{Input: reply.Continue.Input, Delay: time.Duration(reply.Continue.Delay)}}, nil
	}
	return worker.Complete(reply.Output), nil
}
