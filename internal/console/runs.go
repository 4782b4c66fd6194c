package console

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
)

// maxTasks caps the tasks Inspect lists, so that a run with a long chain
// of continuations still makes a page of bounded size.
const maxTasks = 200

// cursorPrefix versions the cursor text, so that its format can change
// and an old cursor is refused instead of misread.
const cursorPrefix = "c2:"

// Spellings of a shard's place in the cursor that are not a pk.
const (
	noBoundText   = "-"
	exhaustedText = "x"
)

// place is where a listing stands on one shard. Each shard is read in pk
// order, newest handle first, so one number says what it has shown: every
// run below bound is still to come, none at or above it is.
type place struct {
	// bound is the pk the next read starts below; zero: none yet, the
	// next read starts at the shard's newest run.
	bound int64
	// exhausted says every run of the listing on this shard was shown, so
	// it is not read again.
	exhausted bool
}

// encodeCursor makes the cursor that continues from places, one per
// shard: "c2:<n>:<p0>,<p1>,..." with a pk, "-" for no bound yet or "x" for
// exhausted, in base64url so that it travels in a URL untouched.
func encodeCursor(places []place) string {
	parts := make([]string, len(places))
	for i, p := range places {
		switch {
		case p.exhausted:
			parts[i] = exhaustedText
		case p.bound == 0:
			parts[i] = noBoundText
		default:
			parts[i] = strconv.FormatInt(p.bound, 10)
		}
	}
	text := fmt.Sprintf("%s%d:%s", cursorPrefix, len(places), strings.Join(parts, ","))
	return base64.RawURLEncoding.EncodeToString([]byte(text))
}

// decodeCursor reverses encodeCursor. A cursor of a listing over another
// number of shards is refused: its places would be other shards' places.
func decodeCursor(c string, n int) ([]place, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64url", ErrBadCursor)
	}
	rest, ok := strings.CutPrefix(string(b), cursorPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: unknown version", ErrBadCursor)
	}
	count, list, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, fmt.Errorf("%w: no shard count", ErrBadCursor)
	}
	made, err := strconv.Atoi(count)
	if err != nil || made < 1 {
		return nil, fmt.Errorf("%w: bad shard count", ErrBadCursor)
	}
	if made != n {
		return nil, fmt.Errorf("%w: made for %d shards, listing %d", ErrBadCursor, made, n)
	}
	parts := strings.Split(list, ",")
	if len(parts) != n {
		return nil, fmt.Errorf("%w: %d places for %d shards", ErrBadCursor, len(parts), n)
	}
	places := make([]place, n)
	for i, s := range parts {
		switch s {
		case exhaustedText:
			places[i].exhausted = true
		case noBoundText:
		default:
			// pks start at 1, so a bound is at least 2 (below it: pk 1).
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil || v < 2 {
				return nil, fmt.Errorf("%w: bad place %q of shard %d", ErrBadCursor, s, i)
			}
			places[i].bound = v
		}
	}
	return places, nil
}

// listed is one run of a shard's answer with what the merge orders it by.
type listed struct {
	createdUS int64 // created_at in Unix microseconds, Postgres's precision
	shard     int
	pk        int64
	run       api.Run
	// stretchEnd: the last run the shard's read could reach this page
	// (RunFilter.MaxScan).
	stretchEnd bool
}

// listRow is a row of RunListAll: a run, its place in the shard's
// stretch (1 for the newest read), and whether it passes the filters (a
// row that does not is the stretch's last, sent for its place).
type listRow struct {
	runstore.RunRow
	Seen    int64 `db:"seen"`
	Matched bool  `db:"matched"`
}

// newer orders runs of a page: created_at descending, then shard
// descending, then pk descending, so that a page reads newest first and
// the same rows always come out in the same order.
func newer(a, b listed) int {
	return cmp.Or(
		cmp.Compare(b.createdUS, a.createdUS),
		cmp.Compare(b.shard, a.shard),
		cmp.Compare(b.pk, a.pk))
}

// ListRuns returns one page of runs of every shard, with the filter
// applied on each shard. Each shard's runs come in the order they were
// written (pk, newest first), and a page merges the shards by creation
// time (newest first; runs created at the same microsecond by higher shard
// index, then higher pk). Paging to the end shows every run exactly once:
// the cursor holds, per shard, the pk its next read starts below, so runs
// started on a shard after its first answer to the listing (with higher
// pks) never appear in a later page and never shift one. Across pages the order is thus newest first
// by each shard's pk, not strictly by creation time, which lets every
// shard's read walk a pk index and stop at the limit. Runs a tenant move
// is copying away (move_out) are left out on the old home, so a run shows
// once. A shard that does not answer is named in UnavailableShards and
// keeps its place: the next page reads it again from there, so none of
// its runs is lost. Listed runs carry no output or error (Inspect reads
// them): those are the fields a workflow can make large, and a page of
// the console shows neither.
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
			// A filter may name every status a run can have, deferred
			// included (a deferred run is listed like the others).
			if !s.Known() {
				return RunPage{}, fmt.Errorf("console: status %q is not a run status", s)
			}
			ss[i] = string(s)
		}
		statuses = ss
	}
	places := make([]place, len(shards))
	if f.Cursor != "" {
		p, err := decodeCursor(f.Cursor, len(shards))
		if err != nil {
			return RunPage{}, err
		}
		places = p
	}
	tenant, queue, name := orNull(f.Tenant), orNull(f.Queue), orNull(f.Name)
	scan := f.MaxScan
	if scan <= 0 {
		scan = runstore.DefaultListScan
	}
	// stretchEnds is, per shard, the pk of its stretch's last run when
	// that run did not match (a shard's goroutine writes only its own).
	stretchEnds := make([]int64, len(shards))

	ok, down, err := fanOut(ctx, shards, func(ctx context.Context, shard int, db *pgxpool.Pool) ([]listed, error) {
		p := places[shard]
		if p.exhausted {
			return nil, nil
		}
		var bound any
		if p.bound != 0 {
			bound = p.bound
		}
		// One more row than the page tells whether rows are left after it;
		// the row after that, when it comes, is the stretch's last.
		rows, err := db.Query(ctx, sqlRunListAll, tenant, queue, name, statuses, bound, limit+1, scan)
		if err != nil {
			return nil, err
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[listRow])
		if err != nil {
			return nil, err
		}
		// Only one branch of the query's union gives rows, each in pk
		// order, but a union promises no order: the merge needs it.
		slices.SortFunc(got, func(a, b listRow) int { return cmp.Compare(b.PK, a.PK) })
		var out []listed
		for _, r := range got {
			l := listed{createdUS: r.CreatedAt.UnixMicro(), shard: shard, pk: r.PK, run: r.Run(shard)}
			if r.Seen == int64(scan) {
				// The stretch's last run: the shard's next read starts
				// below it unless this page shows rows after it.
				l.stretchEnd = true
				if !r.Matched {
					stretchEnds[shard] = r.PK
					continue
				}
			}
			out = append(out, l)
		}
		return out, nil
	})
	if err != nil {
		return RunPage{}, fmt.Errorf("console: list runs: %w", err)
	}

	// Merge by taking, limit times, the newest of the shards' next rows.
	// Taking from each shard only its next row in pk order keeps what a
	// shard has shown a prefix of its pk order, which one bound can name;
	// the newest-row-first sort alone could take a shard's older pk
	// before a newer one (pk order is not creation order: created_at is
	// the start's transaction time, and a moved run keeps its time but
	// gets a new pk), and the bound after it would skip the newer one.
	heads := make([][]listed, len(ok))
	for i, a := range ok {
		heads[i] = a.Value
	}
	taken := make([]int, len(ok))
	var all []listed
	for len(all) < limit {
		best := -1
		for i, h := range heads {
			if len(h) > 0 && (best < 0 || newer(h[0], heads[best][0]) < 0) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		all = append(all, heads[best][0])
		heads[best] = heads[best][1:]
		taken[best]++
	}
	slices.SortFunc(all, newer)

	next := slices.Clone(places)
	for i, a := range ok {
		got := a.Value
		switch {
		case places[a.Shard].exhausted:
		case taken[i] == len(got) && len(got) <= limit:
			// Every match of the shard's stretch is shown. When the
			// stretch ended on a run, unmatched or the last shown, the
			// next read goes on below it; below pk 1 there is nothing.
			end := stretchEnds[a.Shard]
			if end == 0 && len(got) > 0 && got[len(got)-1].stretchEnd {
				end = got[len(got)-1].pk
			}
			if end > 1 {
				next[a.Shard] = place{bound: end}
			} else {
				// The shard had no row after the ones shown.
				next[a.Shard] = place{exhausted: true}
			}
		case taken[i] > 0:
			next[a.Shard] = place{bound: got[taken[i]-1].pk}
		case places[a.Shard].bound == 0:
			// Nothing of the shard made the first page it answered: start
			// its next read just above its newest row now, so that runs
			// started later stay out of this listing as they do on the
			// other shards.
			next[a.Shard] = place{bound: got[0].pk + 1}
		}
	}
	page := RunPage{Runs: []api.Run{}, UnavailableShards: down}
	if slices.ContainsFunc(next, func(p place) bool { return !p.exhausted }) {
		page.NextCursor = encodeCursor(next)
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
	runstore.RunRow
	Input        []byte `db:"input"`
	MaxAttempts  int    `db:"max_attempts"`
	Moving       bool   `db:"moving"`
	TraceContext []byte `db:"trace_context"`
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
// tasks and, while it is queued or deferred, why it waits (Run.Waiting,
// runstore.Waiting): runstore.ErrNotFound when the shard has no such run. The tasks
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
		Run:         r.Run(shard),
		MaxAttempts: r.MaxAttempts,
		Moving:      r.Moving,
		Tasks:       []Task{},
	}
	if len(r.Input) > 0 {
		d.Input = json.RawMessage(r.Input)
	}
	// The start's stored W3C context, read as every span link reads it; a
	// malformed or all-zero one gives no id, since a link would lead
	// nowhere.
	if sc := telemetry.SpanContextFromJSON(r.TraceContext); sc.IsValid() {
		d.TraceID = sc.TraceID().String()
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
	// Why a run that waits to be claimed waits, as GET /v1/runs/{id} says.
	if st := d.Run.Status; st == api.StatusQueued || st == api.StatusDeferred {
		w, err := runstore.Waiting(ctx, db, tenant, id)
		if err != nil && !errors.Is(err, runstore.ErrNotFound) {
			return RunDetail{}, fmt.Errorf("console: why the run waits: %w", err)
		}
		d.Run.Waiting = w
	}
	return d, nil
}
