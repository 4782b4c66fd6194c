package claim

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Completion is one task to finish with CompleteBatch.
type Completion struct {
	ID     int64
	Token  uuid.UUID
	Output json.RawMessage
}

// CompleteBatch finishes several claimed tasks and their runs in one
// statement (one commit on a pool): RecordOutcomes with completions only.
// Each completion is fenced by its own lease token, exactly like Complete:
// errs[i] is nil when completion i was recorded, ErrStaleLease when its
// token is not current (that task and its run are left as they were) and
// ErrNotFound when no task has its id. The other completions of the batch
// are recorded either way. err is set when the statement itself failed;
// then nothing was recorded. A deadlock is retried up to three times when
// db is not a transaction.
func CompleteBatch(ctx context.Context, db shard.Querier, cs []Completion) (errs []error, err error) {
	if len(cs) == 0 {
		return nil, nil
	}
	outs := make([]Outcome, len(cs))
	for i, c := range cs {
		outs[i] = Outcome{Kind: OutcomeComplete, ID: c.ID, Token: c.Token, Output: c.Output}
	}
	res, err := RecordOutcomes(ctx, db, time.Time{}, outs)
	if err != nil {
		return nil, err
	}
	errs = make([]error, len(res))
	for i, r := range res {
		errs[i] = r.Err
	}
	return errs, nil
}
