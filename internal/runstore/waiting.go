package runstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

var (
	sqlRunWaitingState      = sqlfile.Must(sqlFiles, "RunWaitingState")
	sqlRunWaitingDeferred   = sqlfile.Must(sqlFiles, "RunWaitingDeferred")
	sqlRunWaitingFairOwn    = sqlfile.Must(sqlFiles, "RunWaitingFairOwn")
	sqlRunWaitingFairKeys   = sqlfile.Must(sqlFiles, "RunWaitingFairKeys")
	sqlRunWaitingQueueOrder = sqlfile.Must(sqlFiles, "RunWaitingQueueOrder")
)

// Bounds of the work of one Waiting call: beyond them the counts are
// given as lower bounds (RunWaiting.AtLeast).
const (
	// WaitingMaxKeys is the most other fairness keys read for fair_order.
	WaitingMaxKeys = 1000
	// WaitingMaxCount is where each count of tasks ahead stops.
	WaitingMaxCount = 10000
)

// waitingState is a row of RunWaitingState.
type waitingState struct {
	PK            int64      `db:"pk"`
	Status        string     `db:"status"`
	Queue         string     `db:"queue"`
	Now           time.Time  `db:"now"`
	TaskID        *int64     `db:"task_id"`
	TaskState     *string    `db:"task_state"`
	FairnessKey   *string    `db:"fairness_key"`
	QuotaKey      *string    `db:"quota_key"`
	Priority      *int       `db:"priority"`
	Continuation  *bool      `db:"continuation"`
	DueAt         *time.Time `db:"due_at"`
	PausedAt      *time.Time `db:"paused_at"`
	PausedBy      *string    `db:"paused_by"` // read, never shown (see Waiting)
	LiveWorkers   int        `db:"live_workers"`
	FairWorkers   int        `db:"fair_workers"`
	LastSeenAt    *time.Time `db:"last_seen_at"`
	MaxConcurrent *int       `db:"max_concurrent"`
	Rate          *float64   `db:"rate"`
	Burst         *float64   `db:"burst"`
	QuotaRunning  *int       `db:"quota_running"`
	QuotaTokens   *float64   `db:"quota_tokens"`
}

// waitingDeferred is a row of RunWaitingDeferred.
type waitingDeferred struct {
	Mode    string    `db:"mode"`
	Key     string    `db:"key"`
	FiresAt time.Time `db:"fires_at"`
	Size    int       `db:"size"`
	MaxSize *int      `db:"max_size"`
}

// waitingFairOwn is the row of RunWaitingFairOwn.
type waitingFairOwn struct {
	Clock       float64  `db:"clock"`
	Pass        *float64 `db:"pass"`
	Weight      float64  `db:"weight"`
	OwnAhead    int      `db:"own_ahead"`
	HigherAhead int      `db:"higher_ahead"`
}

// waitingFairKey is a row of RunWaitingFairKeys.
type waitingFairKey struct {
	Key       string   `db:"key"`
	Pass      *float64 `db:"pass"`
	Weight    float64  `db:"weight"`
	HasHigher bool     `db:"has_higher"`
	Pending   int      `db:"pending"`
}

// Waiting says why the tenant's run id is not running yet: nil for a run
// that is not queued or deferred, ErrNotFound when there is no such run.
// Of the reasons (api.RunWaiting), in the order they are checked, the
// first that applies is given: the task is not due, its queue is paused,
// no live worker serves the queue, its quota key is at its concurrency cap
// or out of rate tokens, the start is held back as a deferred start (or
// the run has no task), the fair order (or, without fairness keys, the
// queue's order) puts other tasks first; otherwise it is next.
//
// It is the tenant's view, whoever asks: it names no operator (PausedBy is
// left empty) and no other tenant's key (fair_order counts them only).
//
// It costs a few reads bounded by WaitingMaxKeys and WaitingMaxCount, so
// only the read of one run calls it, never a listing. Its figures are a
// snapshot of the moment and, for fair_order, an estimate (FairAhead).
func Waiting(ctx context.Context, db shard.Querier, tenant, id string) (*api.RunWaiting, error) {
	rows, err := db.Query(ctx, sqlRunWaitingState, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("runstore: read run waiting: %w", err)
	}
	st, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[waitingState])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("runstore: read run waiting: %w", err)
	}
	status := api.Status(st.Status)
	if status != api.StatusQueued && status != api.StatusDeferred {
		return nil, nil
	}
	hasTask := st.TaskID != nil
	switch {
	case hasTask && (*st.TaskState == "scheduled" || st.DueAt.After(st.Now)):
		return &api.RunWaiting{Reason: api.WaitNotDue, DueAt: &api.Time{Time: *st.DueAt}}, nil
	case st.PausedAt != nil:
		// Not PausedBy: the waiting object goes to the run's tenant, and
		// the pause is an operator's, whose token is not the tenant's to
		// know. The operators' console adds it (internal/gateway).
		return &api.RunWaiting{Reason: api.WaitQueuePaused, PausedAt: &api.Time{Time: *st.PausedAt}}, nil
	case st.LiveWorkers == 0:
		w := &api.RunWaiting{Reason: api.WaitNoWorker}
		if st.LastSeenAt != nil {
			w.LastSeenAt = &api.Time{Time: *st.LastSeenAt}
		}
		return w, nil
	case hasTask && st.MaxConcurrent != nil && st.QuotaRunning != nil && *st.QuotaRunning >= *st.MaxConcurrent:
		return &api.RunWaiting{Reason: api.WaitQuotaConcurrency, QuotaKey: *st.QuotaKey,
			MaxConcurrent: *st.MaxConcurrent, Running: *st.QuotaRunning}, nil
	case hasTask && st.Rate != nil && st.QuotaTokens != nil && *st.QuotaTokens < 1:
		tokens := *st.QuotaTokens
		return &api.RunWaiting{Reason: api.WaitQuotaRate, QuotaKey: *st.QuotaKey, Rate: *st.Rate,
			Burst: *st.Burst, Tokens: &tokens}, nil
	case !hasTask:
		return admissionWaiting(ctx, db, tenant, id, status)
	}
	if st.FairWorkers > 0 {
		return fairWaiting(ctx, db, &st)
	}
	var ahead int
	if err := db.QueryRow(ctx, sqlRunWaitingQueueOrder, st.Queue, *st.Priority, *st.Continuation, *st.DueAt,
		*st.TaskID, WaitingMaxCount).Scan(&ahead); err != nil {
		return nil, fmt.Errorf("runstore: read queue order: %w", err)
	}
	if ahead == 0 {
		return &api.RunWaiting{Reason: api.WaitNext}, nil
	}
	return &api.RunWaiting{Reason: api.WaitQueueOrder, ClaimsAhead: ahead, AtLeast: ahead >= WaitingMaxCount}, nil
}

// admissionWaiting is the answer for a run without a task to claim: the
// deferred start that holds it, or, should a queued run have no task (a
// start not complete yet), that.
func admissionWaiting(ctx context.Context, db shard.Querier, tenant, id string, status api.Status) (*api.RunWaiting, error) {
	rows, err := db.Query(ctx, sqlRunWaitingDeferred, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("runstore: read deferred start: %w", err)
	}
	g, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[waitingDeferred])
	if errors.Is(err, pgx.ErrNoRows) {
		held := "the run has no task to claim yet"
		if status == api.StatusDeferred {
			held = "the deferred start has not fired yet"
		}
		return &api.RunWaiting{Reason: api.WaitAdmission, Held: held}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runstore: read deferred start: %w", err)
	}
	key := g.Key
	w := &api.RunWaiting{Reason: api.WaitAdmission, DeferMode: api.DeferMode(g.Mode), DeferKey: &key,
		FiresAt: &api.Time{Time: g.FiresAt}}
	if g.MaxSize != nil {
		w.BatchSize, w.BatchMaxSize = g.Size, *g.MaxSize
	}
	return w, nil
}

// fairWaiting reads the fair order's inputs for the task and estimates
// its place with FairAhead.
func fairWaiting(ctx context.Context, db shard.Querier, st *waitingState) (*api.RunWaiting, error) {
	key := *st.FairnessKey
	rows, err := db.Query(ctx, sqlRunWaitingFairOwn, st.Queue, key, *st.Priority, *st.Continuation, *st.DueAt,
		*st.TaskID, WaitingMaxCount)
	if err != nil {
		return nil, fmt.Errorf("runstore: read fair state: %w", err)
	}
	own, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[waitingFairOwn])
	if err != nil {
		return nil, fmt.Errorf("runstore: read fair state: %w", err)
	}
	in := FairInput{
		Clock:       own.Clock,
		Own:         FairKey{Key: key, Pass: own.Pass, Weight: own.Weight, Pending: own.OwnAhead},
		HigherAhead: own.HigherAhead,
		Capped:      own.OwnAhead >= WaitingMaxCount || own.HigherAhead >= WaitingMaxCount,
	}
	// The start tag bounds what the keys' counts need to read.
	s := FairAhead(FairInput{Clock: in.Clock, Own: in.Own}).StartTag
	rows, err = db.Query(ctx, sqlRunWaitingFairKeys, st.Queue, key, *st.Priority, in.Clock, s, WaitingMaxKeys+1)
	if err != nil {
		return nil, fmt.Errorf("runstore: read fair keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByName[waitingFairKey])
	if err != nil {
		return nil, fmt.Errorf("runstore: read fair keys: %w", err)
	}
	if len(keys) > WaitingMaxKeys {
		keys, in.Capped = keys[:WaitingMaxKeys], true
	}
	for _, k := range keys {
		in.Others = append(in.Others, FairKey{Key: k.Key, Pass: k.Pass, Weight: k.Weight, Pending: k.Pending, Higher: k.HasHigher})
	}
	res := FairAhead(in)
	if res.ClaimsAhead == 0 {
		return &api.RunWaiting{Reason: api.WaitNext}, nil
	}
	return &api.RunWaiting{Reason: api.WaitFairOrder, FairnessKey: &key, KeysAhead: res.KeysAhead,
		ClaimsAhead: res.ClaimsAhead, AtLeast: res.AtLeast}, nil
}
