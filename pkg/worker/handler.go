package worker

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Task is what a handler gets: one claimed attempt of one step of a run.
type Task struct {
	ID          int64  // the task row's id
	RunID       string // the run's id (unique per tenant)
	Tenant      string
	Workflow    string // the run's name, which chose the handler
	Queue       string
	Shard       int
	Key         string // fairness key ("" is the default key)
	QuotaKey    string
	Priority    int
	Step        int // 0 for the run's first task, +1 per continuation
	Attempt     int // 1 for the first attempt of this step
	MaxAttempts int
	Input       json.RawMessage
	// Deadline is when the run's timeout, or the worker's DefaultTimeout for a
	// run without one, ends this attempt.
	Deadline time.Time
}

// Result is what a successful handler returns: the run's output, or, with
// Next set, a further step of the run.
type Result struct {
	Output json.RawMessage
	Next   *Next
}

// Next describes the run's next task.
type Next struct {
	Input json.RawMessage
	// Delay postpones the next task (zero: due at once).
	Delay time.Duration
	// Anywhere lets any worker take the next task. By default it is kept
	// for this worker for Config.StickyFor, so state the handler kept in
	// memory is likely still there.
	Anywhere bool
}

// Complete is a Result that finishes the run with output.
func Complete(output json.RawMessage) Result { return Result{Output: output} }

// Continue is a Result that finishes this task and enqueues the run's next
// one with input.
func Continue(input json.RawMessage) Result { return Result{Next: &Next{Input: input}} }

// Handler runs tasks of one workflow. The context ends when the lease is
// lost, the run is cancelled, its timeout (the worker's default without
// one) passes, or the worker's shutdown grace runs out; context.Cause tells which (ErrLeaseLost,
// ErrRunCancelled, ErrAttemptTimeout, ErrShutdown). A handler that returns
// an error fails the attempt: it is retried with exponential backoff and
// jitter until the run has used its max_attempts, then the run fails
// (wrap the error with Permanent to fail the run at once). A panic counts
// as an error.
type Handler interface {
	Handle(ctx context.Context, t Task) (Result, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, t Task) (Result, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, t Task) (Result, error) { return f(ctx, t) }

// Causes of a handler's context ending, for context.Cause.
var (
	ErrLeaseLost      = errors.New("worker: lease lost: the task was rescued or claimed by another worker")
	ErrRunCancelled   = errors.New("worker: run cancelled")
	ErrAttemptTimeout = errors.New("worker: attempt timed out (the run's timeout, or the worker's default)")
	ErrShutdown       = errors.New("worker: shutting down: grace period over")
)

// permanentError marks an error that must not be retried.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent wraps err so the run fails at once, without further attempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}
