package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlRunListAll     = sqlfile.Must(sqlFiles, "RunListAll")
	sqlRunInspect     = sqlfile.Must(sqlFiles, "RunInspect")
	sqlTaskListByRun  = sqlfile.Must(sqlFiles, "TaskListByRun")
	sqlQueueDepthList = sqlfile.Must(sqlFiles, "QueueDepthList")
	sqlKeyClaimShares = sqlfile.Must(sqlFiles, "KeyClaimShares")
)

// shardTimeout bounds each shard's part of a fan-out, so that one shard
// that hangs costs the page only that shard's rows, not the whole page.
const shardTimeout = 5 * time.Second

// fanOut runs fn on every shard at once (internal/shards.Each, the
// module's one fan-out) and returns the answers of the shards that
// answered and the unavailable_shards list (shards.Unavailable). When the
// caller's own context ended, no shard's failure is the shard's fault:
// that is returned as the error instead.
func fanOut[T any](ctx context.Context, dbs []*pgxpool.Pool,
	fn func(ctx context.Context, shard int, db *pgxpool.Pool) (T, error)) ([]shards.Answer[T], []int, error) {
	answers := shards.Each(ctx, dbs, nil, shardTimeout, fn)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return shards.Answered(answers), shards.Unavailable(answers), nil
}

// Paging limits of ListRuns.
const (
	DefaultRunLimit = 50
	MaxRunLimit     = 500
)

// ErrBadCursor means a cursor was not made by ListRuns (or names other
// shards than the ones listed).
var ErrBadCursor = errors.New("console: malformed cursor")

// RunFilter selects runs for ListRuns. Zero fields do not filter.
type RunFilter struct {
	// Tenant limits the list to one tenant (a tenant's session always
	// sets it to its own).
	Tenant   string
	Queue    string
	Name     string
	Statuses []api.Status
	// Cursor continues a listing: the NextCursor of the previous page.
	Cursor string
	// Limit is the page size; zero means DefaultRunLimit.
	Limit int
	// MaxScan bounds the runs a page reads on each shard, matching the
	// filters or not (with Tenant, that tenant's runs); zero means
	// runstore.DefaultListScan. A shard whose read ends there without
	// filling the page is read on from there by the next page, so a page
	// can be short, or empty, and still have a next one.
	MaxScan int
}

// RunPage is one page of runs over every shard, newest first by creation
// time within the page (ListRuns tells the order across pages).
type RunPage struct {
	Runs []api.Run
	// NextCursor fetches the next page; empty on the last one.
	NextCursor string
	// UnavailableShards did not answer; their runs are missing here, and
	// the next page reads them from where this one would have.
	UnavailableShards []int
}

// Task is one task row of a run, as the run's page shows it.
type Task struct {
	ID        int64
	Step      int
	State     string
	Attempt   int
	ClaimedBy string
	ClaimedAt *time.Time
	DueAt     time.Time
	CreatedAt time.Time
}

// RunDetail is everything the run's page shows.
type RunDetail struct {
	Run         api.Run
	Input       json.RawMessage
	MaxAttempts int
	// TraceID is the W3C trace id of the run's start (empty when the
	// start carried no trace context).
	TraceID string
	// Moving says a tenant move is copying the run away from this shard.
	Moving bool
	// Tasks are the run's tasks, oldest first.
	Tasks []Task
}

// Pause is a queue's pause on one shard.
type Pause struct {
	At time.Time
	By string
}

// QueueDepth is one queue on one shard: its tasks by state, the claims of
// the last minute and its pause.
type QueueDepth struct {
	Queue     string
	Shard     int
	Scheduled int
	Pending   int
	Running   int
	// Moving counts tasks a tenant move holds out of play.
	Moving int
	// ClaimsLastMinute counts tasks claimed in the last minute.
	ClaimsLastMinute int
	// Paused is nil unless the queue is paused on this shard.
	Paused *Pause
}

// QueueList is the queues of every shard, by name then shard.
type QueueList struct {
	Queues []QueueDepth
	// Truncated says some shard had more queues than the limit.
	Truncated         bool
	UnavailableShards []int
}

// Shares is the claims of a queue's keys over recent time, summed over the
// shards: Counts[k][b] is the claims of Keys[k] in bucket b, bucket 0 the
// oldest and the last one ending at End (the database clock).
type Shares struct {
	Bucket time.Duration
	End    time.Time
	Keys   []string
	Counts [][]int
	// Total[b] is the claims of every key in bucket b.
	Total             []int
	UnavailableShards []int
}

// OtherKey names the sum of the keys ClaimShares does not list.
const OtherKey = "(other keys)"
