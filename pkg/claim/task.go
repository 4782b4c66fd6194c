package claim

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/harvest-run/harvest/pkg/shard"
)

// NewTask is a task to insert. RunPK must name an existing run.
type NewTask struct {
	RunPK        int64
	Queue        string
	Key          string // fairness key; "" is the default key
	QuotaKey     string
	Priority     int
	Continuation bool
	// DueAt is when the task may run; zero means now. A task due later
	// waits in the scheduled state, out of every claim's path, until
	// PromoteDue (or a claim of its queue) finds it due.
	DueAt        time.Time
	StickyWorker string
	StickyUntil  time.Time
	Step         int
	Input        json.RawMessage
	TraceContext json.RawMessage
	// Now is the time that decides whether DueAt has come; zero means the
	// database clock.
	Now time.Time
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// Enqueue inserts one task and returns its id. It is the only way tasks
// enter a shard (the run's first task at start, retries and continuations
// use the same database function), so every new task is recorded as an
// arrival that the next fair claim of its queue folds into the key heads. Run it in the transaction that writes the run.
func Enqueue(ctx context.Context, db shard.Querier, t NewTask) (int64, error) {
	if t.Queue == "" {
		return 0, errors.New("claim: enqueue: empty queue name")
	}
	var id int64
	err := db.QueryRow(ctx, sqlTaskEnqueue, t.RunPK, t.Queue, t.Key, t.QuotaKey, t.Priority, t.Continuation,
		nullTime(t.DueAt), nullString(t.StickyWorker), nullTime(t.StickyUntil), t.Step,
		nullJSON(t.Input), nullJSON(t.TraceContext), nullTime(t.Now)).Scan(&id)
	if err != nil {
		return 0, mapError("enqueue", err)
	}
	return id, nil
}

// Complete finishes a claimed task and its run with output, in one
// transaction (the run's status, output and finish time, and the tenant's
// running count). A token that is not current gives ErrStaleLease and
// changes nothing.
func Complete(ctx context.Context, db shard.Querier, id int64, token uuid.UUID, output json.RawMessage) error {
	_, err := db.Exec(ctx, sqlTaskComplete, id, token, nullJSON(output))
	return mapError("complete", err)
}

// FailOptions says what a failure does.
type FailOptions struct {
	Error string
	// Retry: run the task again after RetryAfter (database clock; the
	// caller adds its backoff and jitter) or at RetryAt, unless the run has
	// used its max_attempts. Neither set: the run fails now.
	RetryAfter time.Duration
	RetryAt    time.Time
	// Now decides whether RetryAt is already due; zero: database clock.
	Now time.Time
}

// Fail ends the current attempt of a claimed task. It returns true when the
// task will run again, false when the run failed. A token that is not
// current gives ErrStaleLease and changes nothing.
func Fail(ctx context.Context, db shard.Querier, id int64, token uuid.UUID, o FailOptions) (retried bool, err error) {
	var after any
	if o.RetryAt.IsZero() && o.RetryAfter > 0 {
		after = o.RetryAfter.Microseconds()
	}
	err = db.QueryRow(ctx, sqlTaskFail, id, token, o.Error, nullTime(o.RetryAt), after, nullTime(o.Now)).Scan(&retried)
	return retried, mapError("fail", err)
}

// Heartbeat extends the lease of a claimed task to now + extend (database
// clock) and returns the new expiry. A token that is not current gives
// ErrStaleLease.
func Heartbeat(ctx context.Context, db shard.Querier, id int64, token uuid.UUID, extend time.Duration) (time.Time, error) {
	var until time.Time
	err := db.QueryRow(ctx, sqlTaskHeartbeat, id, token, extend.Microseconds()).Scan(&until)
	return until, mapError("heartbeat", err)
}

// ContinueOptions describes a run's next task.
type ContinueOptions struct {
	Input json.RawMessage
	// StickyFor pins the next task to the worker holding this lease for
	// that long (zero: not pinned). StickyUntil sets the end directly.
	StickyFor   time.Duration
	StickyUntil time.Time
	// Delay or DueAt postpone the next task (zero: due now).
	Delay time.Duration
	DueAt time.Time
	// Now is the time the sticky end, delay and due test are taken from;
	// zero: the database clock.
	Now time.Time
}

// Continue finishes a claimed task and enqueues its run's next task in the
// continuation band (same queue, fairness key, quota key and priority;
// step + 1), in one transaction. It returns the new task's id. A token that
// is not current gives ErrStaleLease and changes nothing.
func Continue(ctx context.Context, db shard.Querier, id int64, token uuid.UUID, o ContinueOptions) (int64, error) {
	sticky := o.StickyUntil
	if sticky.IsZero() && o.StickyFor > 0 {
		base := o.Now
		if base.IsZero() {
			base = time.Now()
		}
		sticky = base.Add(o.StickyFor)
	}
	var delay any
	if o.DueAt.IsZero() && o.Delay > 0 {
		delay = o.Delay.Microseconds()
	}
	var next int64
	err := db.QueryRow(ctx, sqlTaskContinue, id, token, nullJSON(o.Input), nullTime(sticky),
		nullTime(o.DueAt), delay, nullTime(o.Now)).Scan(&next)
	return next, mapError("continue", err)
}

// Rescued counts what RescueExpired did.
type Rescued struct {
	Requeued int // tasks put back as pending
	Failed   int // runs failed because they used their attempts
}

// RescueExpired puts back up to limit running tasks whose lease expired
// (database clock), or fails their run when it has used max_attempts. A
// task that was finished meanwhile is never touched; the old lease token is
// void afterwards.
func RescueExpired(ctx context.Context, db shard.Querier, limit int) (Rescued, error) {
	if limit <= 0 {
		limit = 1000
	}
	var r Rescued
	err := db.QueryRow(ctx, sqlTaskRescueExpired, limit).Scan(&r.Requeued, &r.Failed)
	return r, mapError("rescue expired", err)
}

// PromoteDue makes up to limit scheduled tasks that are due at now
// claimable (queue "" means every queue; now zero means the database
// clock) and returns how many it promoted. Each claim also promotes the due
// rows of its own queue, so this is upkeep, not a requirement.
func PromoteDue(ctx context.Context, db shard.Querier, queue string, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		limit = 10000
	}
	var n int
	err := db.QueryRow(ctx, sqlTaskPromoteDue, nullString(queue), nullTime(now), limit).Scan(&n)
	return n, mapError("promote due", err)
}
