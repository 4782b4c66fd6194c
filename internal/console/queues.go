package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Per-shard limits of Queues: a fleet with very many queues still makes
// a page of bounded size.
const (
	defaultQueueLimit = 200
	maxQueueLimit     = 1000
)

// depthRow is what QueueDepthList reads.
type depthRow struct {
	Queue            string     `db:"queue"`
	Scheduled        int        `db:"scheduled"`
	Pending          int        `db:"pending"`
	Running          int        `db:"running"`
	Moving           int        `db:"moving"`
	ClaimsLastMinute int        `db:"claims_last_minute"`
	PausedAt         *time.Time `db:"paused_at"`
	PausedBy         *string    `db:"paused_by"`
}

func (r depthRow) depth(shard int) QueueDepth {
	d := QueueDepth{
		Queue: r.Queue, Shard: shard,
		Scheduled: r.Scheduled, Pending: r.Pending, Running: r.Running, Moving: r.Moving,
		ClaimsLastMinute: r.ClaimsLastMinute,
	}
	if r.PausedAt != nil {
		d.Paused = &Pause{At: *r.PausedAt}
		if r.PausedBy != nil {
			d.Paused.By = *r.PausedBy
		}
	}
	return d
}

// queryDepths reads QueueDepthList: at most limit queues, or with queue
// set (a string) that queue alone.
func queryDepths(ctx context.Context, db *pgxpool.Pool, shard int, limit int, queue any) ([]QueueDepth, error) {
	rows, err := db.Query(ctx, sqlQueueDepthList, limit, queue)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[depthRow])
	if err != nil {
		return nil, err
	}
	out := make([]QueueDepth, len(got))
	for i, r := range got {
		out[i] = r.depth(shard)
	}
	return out, nil
}

// Queues lists, per shard, every queue with unfinished tasks, fairness
// state, a weight override or a pause, at most limit per shard (zero: 200,
// at most 1000). The first queues by name are kept when a shard has more,
// and Truncated says so. Done tasks are never counted: the history is
// large and the page is about the work in play.
func Queues(ctx context.Context, shards []*pgxpool.Pool, limit int) (QueueList, error) {
	if limit == 0 {
		limit = defaultQueueLimit
	}
	if limit < 0 || limit > maxQueueLimit {
		return QueueList{}, fmt.Errorf("console: limit %d out of 1..%d", limit, maxQueueLimit)
	}
	type part struct {
		depths    []QueueDepth
		truncated bool
	}
	ok, down, err := fanOut(ctx, shards, func(ctx context.Context, shard int, db *pgxpool.Pool) (part, error) {
		// One more queue than the limit tells whether the shard has more.
		d, err := queryDepths(ctx, db, shard, limit+1, nil)
		if err != nil {
			return part{}, err
		}
		if len(d) > limit {
			return part{depths: d[:limit], truncated: true}, nil
		}
		return part{depths: d}, nil
	})
	if err != nil {
		return QueueList{}, fmt.Errorf("console: list queues: %w", err)
	}
	out := QueueList{Queues: []QueueDepth{}, UnavailableShards: down}
	for _, a := range ok {
		out.Queues = append(out.Queues, a.Value.depths...)
		out.Truncated = out.Truncated || a.Value.truncated
	}
	sortDepths(out.Queues)
	return out, nil
}

// QueueDepths is Queues for one queue: one entry per shard that answered
// (zero counts where the queue has nothing).
func QueueDepths(ctx context.Context, shards []*pgxpool.Pool, queue string) (QueueList, error) {
	if queue == "" {
		return QueueList{}, errors.New("console: queue is empty")
	}
	ok, down, err := fanOut(ctx, shards, func(ctx context.Context, shard int, db *pgxpool.Pool) ([]QueueDepth, error) {
		return queryDepths(ctx, db, shard, 1, queue)
	})
	if err != nil {
		return QueueList{}, fmt.Errorf("console: queue depths: %w", err)
	}
	out := QueueList{Queues: []QueueDepth{}, UnavailableShards: down}
	for _, a := range ok {
		out.Queues = append(out.Queues, a.Value...)
	}
	sortDepths(out.Queues)
	return out, nil
}

// sortDepths puts depths in the order of QueueList: by queue, then shard.
func sortDepths(d []QueueDepth) {
	slices.SortFunc(d, func(a, b QueueDepth) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Shard, b.Shard))
	})
}
