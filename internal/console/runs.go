package console

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// maxTasks caps the tasks Inspect lists, so that a run with a long chain
// of continuations still makes a page of bounded size.
const maxTasks = 200

// cursorPrefix versions the cursor text, so that its format can change
// and an old cursor is refused instead of misread.
const cursorPrefix = "c1:"

// position is a place in the order of ListRuns over every shard:
// created_at descending, then shard descending, then pk descending. Each
// run has one, and no two runs share one, so "after the last run of the
// page" is exact however runs arrive or finish meanwhile.
type position struct {
	createdUS int64 // created_at in Unix microseconds, Postgres's precision
	shard     int
	pk        int64
}

// encodeCursor makes the cursor that continues after p, for a listing of
// n shards.
func encodeCursor(n int, p position) string {
	text := fmt.Sprintf("%s%d:%d:%d:%d", cursorPrefix, n, p.createdUS, p.shard, p.pk)
	return base64.RawURLEncoding.EncodeToString([]byte(text))
}

// decodeCursor reverses encodeCursor. A cursor of a listing over another
// number of shards is refused: its shard numbers would mean other shards.
func decodeCursor(c string, n int) (position, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return position{}, fmt.Errorf("%w: not base64url", ErrBadCursor)
	}
	rest, ok := strings.CutPrefix(string(b), cursorPrefix)
	if !ok {
		return position{}, fmt.Errorf("%w: unknown version", ErrBadCursor)
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 4 {
		return position{}, ErrBadCursor
	}
	var nums [4]int64
	for i, s := range parts {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return position{}, ErrBadCursor
		}
		nums[i] = v
	}
	if nums[0] != int64(n) {
		return position{}, fmt.Errorf("%w: made for %d shards, listing %d", ErrBadCursor, nums[0], n)
	}
	if nums[2] < 0 || nums[2] >= int64(n) || nums[3] <= 0 {
		return position{}, ErrBadCursor
	}
	return position{createdUS: nums[1], shard: int(nums[2]), pk: nums[3]}, nil
}

// after returns the bound that shard gives RunListAll for the rows after
// p: rows with (created_at, pk) below the pair. Shards after p's shard in
// the order (lower indexes) still owe the runs created at p's very time;
// shards before it (higher indexes) gave all of those already.
func (p position) after(shard int) (time.Time, int64) {
	at := time.UnixMicro(p.createdUS)
	switch {
	case shard < p.shard:
		return at, math.MaxInt64
	case shard > p.shard:
		return at, 0 // pks start at 1: no run at p's time is left here
	default:
		return at, p.pk
	}
}

// runRow is the run columns RunListAll and RunInspect share, by name.
type runRow struct {
	PK          int64      `db:"pk"`
	ID          string     `db:"id"`
	Tenant      string     `db:"tenant"`
	Name        string     `db:"name"`
	Queue       string     `db:"queue"`
	FairnessKey string     `db:"fairness_key"`
	QuotaKey    string     `db:"quota_key"`
	Priority    int        `db:"priority"`
	Status      string     `db:"status"`
	Attempts    int        `db:"attempts"`
	CreatedAt   time.Time  `db:"created_at"`
	ClaimedAt   *time.Time `db:"claimed_at"`
	FinishedAt  *time.Time `db:"finished_at"`
	Output      []byte     `db:"output"`
	Error       *string    `db:"error"`
}

// run is the row as the API shows it, on shard.
func (r runRow) run(shard int) api.Run {
	run := api.Run{
		ID: r.ID, Tenant: r.Tenant, Name: r.Name, Queue: r.Queue, Shard: shard,
		FairnessKey: r.FairnessKey, QuotaKey: r.QuotaKey, Priority: r.Priority,
		Status: api.Status(r.Status), Attempts: r.Attempts,
		CreatedAt: api.Time{Time: r.CreatedAt}, Error: r.Error,
	}
	if r.ClaimedAt != nil {
		run.ClaimedAt = &api.Time{Time: *r.ClaimedAt}
	}
	if r.FinishedAt != nil {
		run.FinishedAt = &api.Time{Time: *r.FinishedAt}
	}
	if len(r.Output) > 0 {
		run.Output = json.RawMessage(r.Output)
	}
	return run
}

// validStatuses are the statuses a filter may name: every status a run
// can have, deferred included (a deferred run is listed like the others).
var validStatuses = []api.Status{
	api.StatusDeferred, api.StatusQueued, api.StatusRunning,
	api.StatusCompleted, api.StatusFailed, api.StatusCancelled,
}

// listed is one run of a shard's answer with its place in the order.
type listed struct {
	pos position
	run api.Run
}

// ListRuns returns one page of runs of every shard, newest first (by
// creation time; runs created at the same microsecond by higher shard
// index, then newer handle, first), with the filter applied on each
// shard. Runs a tenant move is copying away (move_out) are left out on the
// old home, so a run shows once.
//
// The cursor holds the place of the page's last run in that order, and
// the next page lists the runs after it: runs started since the first page
// are newer than every run listed, so they never appear in a later page
// and never shift one. A shard that does not answer is named in
// UnavailableShards and its runs are missing from that page (a later page
// does not go back for them).
func ListRuns(ctx context.Context, shards []*pgxpool.Pool, f RunFilter) (RunPage, error) {
	limit := f.Limit
	if limit == 0 {
		limit = DefaultRunLimit
	}
	if limit < 0 || limit > MaxRunLimit {
		return RunPage{}, fmt.Errorf("console: limit %d out of 1..%d", f.Limit, MaxRunLimit)
	}
	var statuses any
	if len(f.Statuses) > 0 {
		ss := make([]string, len(f.Statuses))
		for i, s := range f.Statuses {
			if !slices.Contains(validStatuses, s) {
				return RunPage{}, fmt.Errorf("console: status %q is not a run status", s)
			}
			ss[i] = string(s)
		}
		statuses = ss
	}
	var from *position
	if f.Cursor != "" {
		p, err := decodeCursor(f.Cursor, len(shards))
		if err != nil {
			return RunPage{}, err
		}
		from = &p
	}
	tenant, queue, name := orNull(f.Tenant), orNull(f.Queue), orNull(f.Name)

	ok, down, err := fanOut(ctx, shards, func(ctx context.Context, shard int, db *pgxpool.Pool) ([]listed, error) {
		var at, pk any
		if from != nil {
			at, pk = from.after(shard)
		}
		// One more row than the page tells whether rows are left after it.
		rows, err := db.Query(ctx, sqlRunListAll, tenant, queue, name, statuses, at, pk, limit+1)
		if err != nil {
			return nil, err
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[runRow])
		if err != nil {
			return nil, err
		}
		out := make([]listed, len(got))
		for i, r := range got {
			out[i] = listed{
				pos: position{createdUS: r.CreatedAt.UnixMicro(), shard: shard, pk: r.PK},
				run: r.run(shard),
			}
		}
		return out, nil
	})
	if err != nil {
		return RunPage{}, fmt.Errorf("console: list runs: %w", err)
	}

	// Each shard gave its first limit+1 rows after the cursor, so the first
	// limit rows of the merge are the first limit rows overall.
	var all []listed
	for _, a := range ok {
		all = append(all, a.Value...)
	}
	slices.SortFunc(all, func(a, b listed) int {
		return cmp.Or(
			cmp.Compare(b.pos.createdUS, a.pos.createdUS),
			cmp.Compare(b.pos.shard, a.pos.shard),
			cmp.Compare(b.pos.pk, a.pos.pk))
	})
	page := RunPage{Runs: []api.Run{}, UnavailableShards: down}
	if len(all) > limit {
		all = all[:limit]
		page.NextCursor = encodeCursor(len(shards), all[limit-1].pos)
	}
	for _, l := range all {
		page.Runs = append(page.Runs, l.run)
	}
	return page, nil
}

// orNull is s, or SQL NULL (no filter) when s is empty.
func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// inspectRow is what RunInspect reads.
type inspectRow struct {
	runRow
	Input       []byte  `db:"input"`
	MaxAttempts int     `db:"max_attempts"`
	Moving      bool    `db:"moving"`
	Traceparent *string `db:"traceparent"`
}

// taskRow is what TaskListByRun reads.
type taskRow struct {
	ID        int64      `db:"id"`
	Step      int        `db:"step"`
	State     string     `db:"state"`
	Attempt   int        `db:"attempt"`
	ClaimedBy *string    `db:"claimed_by"`
	ClaimedAt *time.Time `db:"claimed_at"`
	DueAt     time.Time  `db:"due_at"`
	CreatedAt time.Time  `db:"created_at"`
}

// Inspect reads one run of tenant on db (shard is its index) with its
// tasks: runstore.ErrNotFound when the shard has no such run. The tasks
// listed are the run's newest 200 (oldest of them first), so that a long
// chain of continuations still shows its live task.
func Inspect(ctx context.Context, db *pgxpool.Pool, shard int, tenant, id string) (RunDetail, error) {
	rows, err := db.Query(ctx, sqlRunInspect, tenant, id)
	if err != nil {
		return RunDetail{}, fmt.Errorf("console: inspect run: %w", err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[inspectRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return RunDetail{}, runstore.ErrNotFound
	}
	if err != nil {
		return RunDetail{}, fmt.Errorf("console: inspect run: %w", err)
	}
	d := RunDetail{
		Run:         r.run(shard),
		MaxAttempts: r.MaxAttempts,
		Moving:      r.Moving,
		Tasks:       []Task{},
	}
	if len(r.Input) > 0 {
		d.Input = json.RawMessage(r.Input)
	}
	if r.Traceparent != nil {
		d.TraceID = traceID(*r.Traceparent)
	}

	rows, err = db.Query(ctx, sqlTaskListByRun, r.PK, maxTasks)
	if err != nil {
		return RunDetail{}, fmt.Errorf("console: list tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, pgx.RowToStructByName[taskRow])
	if err != nil {
		return RunDetail{}, fmt.Errorf("console: list tasks: %w", err)
	}
	for _, t := range tasks {
		task := Task{ID: t.ID, Step: t.Step, State: t.State, Attempt: t.Attempt,
			ClaimedAt: t.ClaimedAt, DueAt: t.DueAt, CreatedAt: t.CreatedAt}
		if t.ClaimedBy != nil {
			task.ClaimedBy = *t.ClaimedBy
		}
		d.Tasks = append(d.Tasks, task)
	}
	return d, nil
}

// traceID is the trace id of a W3C traceparent
// ("<version>-<trace id>-<parent id>-<flags>"), or "" when the header is
// malformed or names the invalid all-zero trace: a link to it would lead
// nowhere.
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 {
		return ""
	}
	version, trace, parent := parts[0], parts[1], parts[2]
	if !lowerHex(version, 2) || version == "ff" || (version == "00" && len(parts) != 4) {
		return ""
	}
	if !lowerHex(trace, 32) || !lowerHex(parent, 16) || !lowerHex(parts[3], 2) {
		return ""
	}
	if strings.Trim(trace, "0") == "" {
		return ""
	}
	return trace
}

// lowerHex reports whether s is n lowercase hexadecimal digits, the only
// spelling W3C trace context allows.
func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
