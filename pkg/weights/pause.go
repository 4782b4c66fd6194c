package weights

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
	routing "github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/shard"
)

var (
	sqlQueuePauseSetOne = sqlfile.Must(sqlFiles, "QueuePauseSetOne")
	sqlQueuePauseGet    = sqlfile.Must(sqlFiles, "QueuePauseGet")
)

// Audit actions of a pause and a resume.
const (
	ActionQueuePause  = "queue.pause"
	ActionQueueResume = "queue.resume"
)

// PauseChange is what one shard did with a pause or a resume.
type PauseChange struct {
	// Changed is false when the queue already was as asked.
	Changed bool
	// Paused is the queue's pause after the call; nil after a resume.
	Paused *api.QueuePause
}

// PauseOne pauses (paused true) or resumes queue on the shard of db and
// writes its audit row in the same statement. While a queue is paused its
// claims take nothing, whatever the claimer; starts are still written.
// The call waits for the claims of the queue already under way on the
// shard, so once it returns none of them is still taking tasks. Pausing a
// paused queue (or resuming a running one) succeeds and changes nothing.
func PauseOne(ctx context.Context, db shard.Querier, actor, queue string, paused bool) (PauseChange, error) {
	if err := validateActor(actor); err != nil {
		return PauseChange{}, err
	}
	if err := ValidateQueue(queue); err != nil {
		return PauseChange{}, err
	}
	r, err := pgrow.One[pauseSetRow](ctx, db, sqlQueuePauseSetOne, queue, paused, actor)
	if err != nil {
		return PauseChange{}, mapError("pause queue", err)
	}
	out := PauseChange{Changed: r.Changed}
	if r.At != nil && r.By != nil {
		out.Paused = &api.QueuePause{At: api.Time{Time: *r.At}, By: *r.By}
	}
	return out, nil
}

// PausedOne reads the pause of queue on the shard of db: nil when the
// queue runs there.
func PausedOne(ctx context.Context, db shard.Querier, queue string) (*api.QueuePause, error) {
	r, err := pgrow.One[pauseRow](ctx, db, sqlQueuePauseGet, queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, mapError("read queue pause", err)
	}
	return &api.QueuePause{At: api.Time{Time: r.At}, By: r.By}, nil
}

// Pause pauses (paused true) or resumes queue on every shard. The error is
// non-nil only for invalid arguments (an *api.Error, status 400), in which
// case no shard was written; every shard's fate is in the result (200,
// 207 or 503 by Status). Both are idempotent, so sending the same request
// again after a 207 converges. With WithNATS a resume wakes the workers of
// every shard that took it, so the backlog is claimed at once rather than
// at their next poll.
func Pause(ctx context.Context, shards []Shard, actor, queue string, paused bool, opts ...Option) (api.QueuePauseResult, error) {
	if err := validateActor(actor); err != nil {
		return api.QueuePauseResult{}, err
	}
	if err := ValidateQueue(queue); err != nil {
		return api.QueuePauseResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.QueuePauseResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (PauseChange, error) {
		return PauseOne(ctx, db, actor, queue, paused)
	})
	out := api.QueuePauseResult{Queue: queue, Paused: paused, Shards: []api.QueuePauseShard{}, UnavailableShards: routing.Unavailable(res)}
	for _, r := range res {
		s := api.QueuePauseShard{ShardOutcome: outcomeOf(r.Shard, r.Err), Paused: r.Value.Paused, Changed: r.Value.Changed}
		if r.Err == nil && !paused && o.nc != nil {
			// A lost wake-up costs the workers' poll interval, not a task.
			_ = dispatch.Publish(ctx, o.nc, o.subjects.Wake(r.Shard, queue), dispatch.Wake{})
		}
		out.Shards = append(out.Shards, s)
	}
	return out, nil
}
