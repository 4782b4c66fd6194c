package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

var sqlTaskCompleteBatch = mustSQL("TaskCompleteBatch")

// Completion is one task to finish with CompleteBatch.
type Completion struct {
	ID     int64
	Token  uuid.UUID
	Output json.RawMessage
}

// CompleteBatch finishes several claimed tasks and their runs in one
// statement (one commit on a pool). Each completion is fenced by its own
// lease token, exactly like Complete: errs[i] is nil when completion i was
// recorded, ErrStaleLease when its token is not current (that task and its
// run are left as they were) and ErrNotFound when no task has its id. The
// other completions of the batch are recorded either way. err is set when
// the statement itself failed; then nothing was recorded. A deadlock is
// retried up to three times when db is not a transaction.
func CompleteBatch(ctx context.Context, db DB, cs []Completion) (errs []error, err error) {
	if len(cs) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(cs))
	tokens := make([]uuid.UUID, len(cs))
	outputs := make([]any, len(cs))
	for i, c := range cs {
		ids[i], tokens[i], outputs[i] = c.ID, c.Token, nullJSON(c.Output)
	}
	tries := 3
	if _, inTx := db.(pgx.Tx); inTx {
		tries = 1
	}
	for attempt := 0; attempt < tries; attempt++ {
		errs, err = completeBatchOnce(ctx, db, ids, tokens, outputs)
		if !errors.Is(err, ErrDeadlock) {
			break
		}
	}
	return errs, err
}

func completeBatchOnce(ctx context.Context, db DB, ids []int64, tokens []uuid.UUID, outputs []any) ([]error, error) {
	rows, err := db.Query(ctx, sqlTaskCompleteBatch, ids, tokens, outputs)
	if err != nil {
		return nil, mapError("complete batch", err)
	}
	errs := make([]error, len(ids))
	i := 0
	for rows.Next() {
		var (
			id      int64
			outcome string
		)
		if err := rows.Scan(&id, &outcome); err != nil {
			rows.Close()
			return nil, mapError("complete batch", err)
		}
		if i >= len(ids) || ids[i] != id {
			rows.Close()
			return nil, fmt.Errorf("claim: complete batch: answer %d is for task %d, not the one asked", i, id)
		}
		switch outcome {
		case "ok":
		case "stale":
			errs[i] = fmt.Errorf("claim: complete batch: task %d: %w", id, ErrStaleLease)
		case "not_found":
			errs[i] = fmt.Errorf("claim: complete batch: task %d: %w", id, ErrNotFound)
		default:
			errs[i] = fmt.Errorf("claim: complete batch: task %d: unknown outcome %q", id, outcome)
		}
		i++
	}
	if err := rows.Err(); err != nil {
		return nil, mapError("complete batch", err)
	}
	if i != len(ids) {
		return nil, fmt.Errorf("claim: complete batch: %d answers for %d tasks", i, len(ids))
	}
	return errs, nil
}
