package claim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// StateKey names one fairness state row.
type StateKey struct {
	Queue string `json:"queue"`
	Key   string `json:"key"`
}

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
// pending task and no charge inside the window loses all its rows. With
// preview set nothing is deleted: the same statement runs on a temporary
// copy, so no real row is locked and no claim waits for it.
func PruneFairState(ctx context.Context, db DB, now time.Time, window time.Duration, preview bool) ([]StateKey, error) {
	rows, err := db.Query(ctx, sqlFairStatePrune, nullTime(now), window.Microseconds(), preview)
	if err != nil {
		return nil, mapError("prune fair state", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StateKey, error) {
		var k StateKey
		err := r.Scan(&k.Queue, &k.Key)
		return k, err
	})
	if err != nil {
		return nil, mapError("prune fair state", err)
	}
	return out, nil
}

// FairState lists the fairness state rows of every queue (keys charged at
// least once and not pruned since), sorted by queue and key.
func FairState(ctx context.Context, db DB) ([]StateRow, error) {
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
