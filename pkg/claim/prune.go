package claim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

// StateKey names one fairness state row; it is the model's
// (fairkeys.StateKey), so the claim and its reference model report pruned
// keys alike.
type StateKey = fairkeys.StateKey

// StateRow is one key's fairness state.
type StateRow struct {
	Queue     string
	Key       string
	Pass      float64
	LastStart float64
	ChargedAt time.Time
}

// PruneFairState deletes idle fairness state and returns the rows deleted,
// sorted by queue and key. A key's row goes when the key has no pending
// task (due or not) in the queue, it was last charged at or before
// now - window, and it is not the queue's clock row (the greatest
// (last_start, key)), so the queue clock never falls. A queue with no
// pending task and no charge inside the window loses all its rows. Each
// queue is pruned in a statement of its own under the queue's fair lock
// (on a pool, one short transaction per queue). With preview set nothing
// is deleted: the same statement runs on a temporary copy and takes no
// lock, so no claim waits for it.
func PruneFairState(ctx context.Context, db shard.Querier, now time.Time, window time.Duration, preview bool) ([]StateKey, error) {
	queues, err := fairQueues(ctx, db, sqlFairQueues)
	if err != nil {
		return nil, mapError("prune fair state", err)
	}
	var out []StateKey
	for _, q := range queues {
		rows, err := db.Query(ctx, sqlFairStatePrune, q, nullTime(now), window.Microseconds(), preview)
		if err != nil {
			return nil, mapError("prune fair state", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowToStructByName[StateKey])
		if err != nil {
			return nil, mapError("prune fair state", err)
		}
		out = append(out, keys...)
	}
	return out, nil
}

// Repaired reports what Repair changed in one queue's key heads.
type Repaired struct {
	Queue string `json:"queue"`
	// Repaired counts keys whose head was missing or came after their
	// first pending row: work a fair claim could not have found by itself
	// (a bulk load with the triggers off, a hand edit).
	Repaired int `json:"repaired"`
	// Refreshed counts heads that named rows no longer pending, which the
	// claims would have fixed as they met them.
	Refreshed int `json:"refreshed"`
}

// Repair rebuilds the key heads of each queue from its task rows: the
// given queues, or, when none is given, every queue with pending work,
// fairness state or new arrivals. Each queue is repaired in a statement
// of its own under the queue's fair lock, so claims go on meanwhile (a fair
// claim of the queue waits for the repair as for another claim). Its cost
// is one index descent per key with pending work.
func Repair(ctx context.Context, db shard.Querier, queues ...string) ([]Repaired, error) {
	if len(queues) == 0 {
		var err error
		if queues, err = fairQueues(ctx, db, sqlTaskQueues); err != nil {
			return nil, mapError("repair", err)
		}
	}
	out := make([]Repaired, 0, len(queues))
	for _, q := range queues {
		r := Repaired{Queue: q}
		if err := db.QueryRow(ctx, sqlFairStateRepair, q).Scan(&r.Repaired, &r.Refreshed); err != nil {
			return out, mapError("repair "+q, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func fairQueues(ctx context.Context, db shard.Querier, q string) ([]string, error) {
	rows, err := db.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// FairState lists the fairness state rows of every queue (keys charged at
// least once and not pruned since), sorted by queue and key.
func FairState(ctx context.Context, db shard.Querier) ([]StateRow, error) {
	rows, err := db.Query(ctx, sqlFairStateList)
	if err != nil {
		return nil, mapError("list fair state", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StateRow, error) {
		var s StateRow
		err := r.Scan(&s.Queue, &s.Key, &s.Pass, &s.LastStart, &s.ChargedAt)
		return s, err
	})
	return out, mapError("list fair state", err)
}
