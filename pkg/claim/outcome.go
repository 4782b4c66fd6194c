package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

var (
	sqlTaskOutcomeBatch  = sqlfile.Must(sqlFiles, "TaskOutcomeBatch")
	sqlTaskHeartbeatMany = sqlfile.Must(sqlFiles, "TaskHeartbeatMany")
)

// OutcomeKind says what an outcome does to its task and run.
type OutcomeKind string

// The kinds of outcome RecordOutcomes records. Each does exactly what the
// single-task call of the same name does (Complete, Continue, Fail); the
// database defines each once (harvest_outcome_batch).
const (
	// OutcomeComplete: the task is done and its run completed.
	OutcomeComplete OutcomeKind = "complete"
	// OutcomeContinue: the task is done and the run's next task enqueued.
	OutcomeContinue OutcomeKind = "continue"
	// OutcomeFail: the attempt failed; retried or the run failed.
	OutcomeFail OutcomeKind = "fail"
	// OutcomeRelease: the task is handed back untouched (pending again,
	// the attempt not counted, the run queued again), as a stopping
	// worker does with a task it could not finish.
	OutcomeRelease OutcomeKind = "release"
)

// Outcome is the outcome of one leased task, for RecordOutcomes.
type Outcome struct {
	Kind  OutcomeKind
	ID    int64
	Token uuid.UUID
	// Output is a completion's output.
	Output json.RawMessage
	// Fail is a failure's error and retry. RetryAfter counts from the
	// database clock; Fail.Now is not read (RecordOutcomes' now is).
	Fail FailOptions
	// Continue is a continuation's next task. Its Delay and StickyFor
	// count from RecordOutcomes' now, or the database clock when it is
	// zero (Continue counts StickyFor from the caller's clock);
	// Continue.Now is not read.
	Continue ContinueOptions
}

// OutcomeResult is what became of one outcome of RecordOutcomes.
type OutcomeResult struct {
	// Err is nil when the outcome was recorded, ErrStaleLease when its
	// token was not the task's current one (nothing of that task or its
	// run changed) and ErrNotFound when no task has its id.
	Err error
	// Retried: a failure whose task will run again.
	Retried bool
	// NextID is a continuation's new task.
	NextID int64
	// Run is the run as the run event (harvest.runs.<tenant>.<run_id>)
	// shows it, when this outcome made it final (completed or failed) and
	// the run is to be announced (its start asked with notify, or a long
	// poll waits for it); nil when the run goes on, was final already
	// (cancelled) or is not announced. Its Shard is zero: the caller knows
	// which shard it asked.
	Run *api.Run
}

// RecordOutcomes records the outcomes of several leased tasks in one
// statement (one commit on a pool), each fenced by its own lease token
// exactly like the single-task calls, and answers each in order. now
// decides whether a retry or continuation is due at once and is the base
// of a continuation's delay and sticky window; zero means the database
// clock. err is set when the statement failed; then nothing was recorded.
// A deadlock is retried up to three times when db is not a transaction.
//
// The statement locks the tasks by id, then the runs, then the count rows
// of the tenants whose runs it finishes in byte order, then enqueues the
// continuations in (queue, key) order: the order of every other statement
// that holds several of them, so that batches, starts, cancels and the
// rescue of expired leases do not deadlock.
func RecordOutcomes(ctx context.Context, db shard.Querier, now time.Time, outs []Outcome) ([]OutcomeResult, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	n := len(outs)
	// Typed arrays, not []any: pgx encodes each in binary at once, where
	// an []any (or a driver.Valuer such as uuid.UUID, sent as text) is
	// planned element by element, which cost a worker in a flood more CPU
	// than the rest of the statement's handling.
	var (
		kinds                         = make([]string, n)
		ids                           = make([]int64, n)
		tokens                        = make([]pgtype.UUID, n)
		values                        = make([]json.RawMessage, n)
		errTexts                      = make([]pgtype.Text, n)
		retryAt, dueAt, stickyAt      = make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n)
		retryUS, delayUS, stickyForUS = make([]pgtype.Int8, n), make([]pgtype.Int8, n), make([]pgtype.Int8, n)
	)
	for i, o := range outs {
		kinds[i], ids[i], tokens[i] = string(o.Kind), o.ID, pgtype.UUID{Bytes: o.Token, Valid: true}
		switch o.Kind {
		case OutcomeComplete:
			values[i] = jsonOrNull(o.Output)
		case OutcomeContinue:
			c := o.Continue
			values[i] = jsonOrNull(c.Input)
			dueAt[i] = timeOrNull(c.DueAt)
			if c.DueAt.IsZero() && c.Delay > 0 {
				delayUS[i] = pgtype.Int8{Int64: c.Delay.Microseconds(), Valid: true}
			}
			stickyAt[i] = timeOrNull(c.StickyUntil)
			if c.StickyUntil.IsZero() && c.StickyFor > 0 {
				stickyForUS[i] = pgtype.Int8{Int64: c.StickyFor.Microseconds(), Valid: true}
			}
		case OutcomeFail:
			f := o.Fail
			errTexts[i] = pgtype.Text{String: f.Error, Valid: true}
			retryAt[i] = timeOrNull(f.RetryAt)
			if f.RetryAt.IsZero() && f.RetryAfter > 0 {
				retryUS[i] = pgtype.Int8{Int64: f.RetryAfter.Microseconds(), Valid: true}
			}
		case OutcomeRelease:
		default:
			return nil, fmt.Errorf("claim: record outcomes: task %d: unknown outcome kind %q", o.ID, o.Kind)
		}
	}
	args := []any{kinds, ids, tokens, values, errTexts, retryAt, retryUS, dueAt, delayUS, stickyAt, stickyForUS, nullTime(now)}
	tries := 3
	if _, inTx := db.(pgx.Tx); inTx {
		tries = 1
	}
	var (
		res []OutcomeResult
		err error
	)
	for range tries {
		res, err = recordOutcomesOnce(ctx, db, ids, args)
		if !errors.Is(err, ErrDeadlock) {
			break
		}
	}
	return res, err
}

func recordOutcomesOnce(ctx context.Context, db shard.Querier, ids []int64, args []any) ([]OutcomeResult, error) {
	rows, err := db.Query(ctx, sqlTaskOutcomeBatch, args...)
	if err != nil {
		return nil, mapError("record outcomes", err)
	}
	defer rows.Close()
	out := make([]OutcomeResult, len(ids))
	i := 0
	for rows.Next() {
		var (
			id       int64
			outcome  string
			retried  bool
			next     *int64
			runID    *string
			r        api.Run
			status   *string
			prio     *int
			attempts *int
			created  *time.Time
			claimed  *time.Time
			finished *time.Time
			output   []byte
			fk, qk   *string
			tenant   *string
			name     *string
			queue    *string
		)
		if err := rows.Scan(&id, &outcome, &retried, &next, &runID, &tenant, &name, &queue, &fk, &qk, &prio,
			&status, &attempts, &created, &claimed, &finished, &output, &r.Error); err != nil {
			return nil, mapError("record outcomes", err)
		}
		if i >= len(ids) || ids[i] != id {
			return nil, fmt.Errorf("claim: record outcomes: answer %d is for task %d, not the one asked", i, id)
		}
		res := &out[i]
		switch outcome {
		case "ok":
		case "stale":
			res.Err = fmt.Errorf("claim: record outcomes: task %d: %w", id, ErrStaleLease)
		case "not_found":
			res.Err = fmt.Errorf("claim: record outcomes: task %d: %w", id, ErrNotFound)
		default:
			res.Err = fmt.Errorf("claim: record outcomes: task %d: unknown outcome %q", id, outcome)
		}
		res.Retried = retried
		if next != nil {
			res.NextID = *next
		}
		if runID != nil {
			r.ID, r.Tenant, r.Name, r.Queue = *runID, deref(tenant), deref(name), deref(queue)
			r.FairnessKey, r.QuotaKey, r.Status = deref(fk), deref(qk), api.Status(deref(status))
			if prio != nil {
				r.Priority = *prio
			}
			if attempts != nil {
				r.Attempts = *attempts
			}
			if created != nil {
				r.CreatedAt = api.Time{Time: *created}
			}
			if claimed != nil {
				r.ClaimedAt = &api.Time{Time: *claimed}
			}
			if finished != nil {
				r.FinishedAt = &api.Time{Time: *finished}
			}
			if len(output) > 0 {
				r.Output = json.RawMessage(output)
			}
			res.Run = &r
		}
		i++
	}
	if err := rows.Err(); err != nil {
		return nil, mapError("record outcomes", err)
	}
	if i != len(ids) {
		return nil, fmt.Errorf("claim: record outcomes: %d answers for %d tasks", i, len(ids))
	}
	return out, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Lease names a task under lease, for Heartbeats.
type Lease struct {
	ID    int64
	Token uuid.UUID
}

// Beat is what a heartbeat found of one lease.
type Beat string

// The answers of Heartbeats.
const (
	// BeatOK: the lease was extended.
	BeatOK Beat = "ok"
	// BeatCancelled: the lease was extended, but the run was cancelled;
	// its handler should stop.
	BeatCancelled Beat = "cancelled"
	// BeatStale: the token is not the task's current one (the lease ran
	// out and the task was rescued, or it was cancelled or finished);
	// nothing was changed. The holder has lost the task.
	BeatStale Beat = "stale"
	// BeatNotFound: no task has that id.
	BeatNotFound Beat = "not_found"
)

// Heartbeats extends the leases of several tasks to now + extend (database
// clock) in one statement, each fenced by its own token, and answers each
// in order. The extension writes no index entry where the row's page has
// room for its new version (a HOT update), so a worker can beat for all
// its tasks every interval at little cost.
func Heartbeats(ctx context.Context, db shard.Querier, leases []Lease, extend time.Duration) ([]Beat, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(leases))
	tokens := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		ids[i], tokens[i] = l.ID, l.Token
	}
	rows, err := db.Query(ctx, sqlTaskHeartbeatMany, ids, tokens, extend.Microseconds())
	if err != nil {
		return nil, mapError("heartbeats", err)
	}
	defer rows.Close()
	out := make([]Beat, 0, len(leases))
	for rows.Next() {
		var (
			id      int64
			outcome string
		)
		if err := rows.Scan(&id, &outcome); err != nil {
			return nil, mapError("heartbeats", err)
		}
		if len(out) >= len(ids) || ids[len(out)] != id {
			return nil, fmt.Errorf("claim: heartbeats: answer %d is for task %d, not the one asked", len(out), id)
		}
		out = append(out, Beat(outcome))
	}
	if err := rows.Err(); err != nil {
		return nil, mapError("heartbeats", err)
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("claim: heartbeats: %d answers for %d tasks", len(out), len(ids))
	}
	return out, nil
}

// jsonOrNull is b as a JSON array element: NULL when empty, as nullJSON.
func jsonOrNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return b
}

// timeOrNull is t as a timestamptz array element: NULL when zero, as
// nullTime.
func timeOrNull(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}
