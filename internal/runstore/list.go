package runstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Paging limits of List.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
	// MaxListBytes bounds a page's runs as the API encodes them: a page
	// ends early, with a cursor, rather than pass it (unless its one run
	// alone does). A run's error is the one listed field without a bound
	// of its own.
	MaxListBytes = 1 << 20
	// DefaultListScan bounds the runs a page reads, matching or not: a
	// filter that few runs match (a rare final status, a queue or a name)
	// would otherwise read the tenant's whole history for one page. A page that
	// reads this many without filling ends with a cursor, possibly with
	// no runs at all; the next page goes on where it stopped.
	DefaultListScan = 10_000
)

// ListParams selects a page of a tenant's runs. Zero fields do not filter.
type ListParams struct {
	Tenant   string
	Shard    int
	Statuses []api.Status
	Queue    string
	Name     string
	// Cursor continues a listing: the NextCursor of the previous page.
	Cursor string
	// Limit is the page size; zero means DefaultListLimit. It must not
	// exceed MaxListLimit.
	Limit int
	// MaxBytes ends the page early rather than let its runs, encoded as
	// the API lists them (api.ListItem), pass this many bytes; zero means
	// MaxListBytes. A page holds at least one run however large, so that
	// paging always moves on.
	MaxBytes int
	// MaxScan bounds the runs a page reads, matching its filter or not;
	// zero means DefaultListScan. A page that reads that many without
	// filling ends with a cursor below the last run it read. (Without a
	// filter a page reads only the runs it returns, fewer than the
	// default.)
	MaxScan int
}

// ListResult is one page, newest run first.
type ListResult struct {
	Runs []api.Run
	// NextCursor fetches the next page; empty on the last page.
	NextCursor string
}

// sqlRunListUnfinished is RunList for a status filter that only unfinished
// runs can match (deferred, queued, running), with finished_at IS NULL
// stated. The plan then reads the tenant's unfinished runs alone, in the
// listing's order (runs_unfinished_tenant_pk, migration 0016), where
// RunList walks runs_tenant_pk past every finished run of the tenant to
// find them. The condition is in the text rather than behind a parameter:
// a generic plan can use a partial index only for a predicate it is sure
// of.
var sqlRunListUnfinished = unfinishedOnly(sqlRunList)

// unfinishedOnly adds finished_at IS NULL to RunList's conditions.
func unfinishedOnly(q string) string {
	const anchor = "WHERE tenant = $1\n"
	if strings.Count(q, anchor) != 1 {
		panic("runstore: a listing's SQL no longer has one line " + strconv.Quote(anchor))
	}
	return strings.Replace(q, anchor, anchor+"  AND finished_at IS NULL\n", 1)
}

// listRow is a row of RunList: a run, its place in the page's stretch
// (1 for the newest read), and whether it passes the filter (a row that
// does not is the stretch's last, sent for its place).
type listRow struct {
	RunRow
	Seen    int64 `db:"seen"`
	Matched bool  `db:"matched"`
}

// ErrBadCursor means a list cursor was not made by List.
var ErrBadCursor = errors.New("runstore: malformed list cursor")

// cursorPrefix versions the cursor format so that it can change later.
const cursorPrefix = "r1:"

// EncodeCursor makes the opaque cursor that continues below run handle pk.
func EncodeCursor(pk int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + strconv.FormatInt(pk, 10)))
}

// DecodeCursor reverses EncodeCursor.
func DecodeCursor(c string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || !strings.HasPrefix(string(b), cursorPrefix) {
		return 0, ErrBadCursor
	}
	pk, err := strconv.ParseInt(strings.TrimPrefix(string(b), cursorPrefix), 10, 64)
	if err != nil || pk <= 0 {
		return 0, ErrBadCursor
	}
	return pk, nil
}

// List returns one page of the tenant's runs, newest first. Paging is
// stable while runs are added: a cursor continues below the last run seen,
// so new runs never shift later pages. The runs carry no output (a listing
// leaves it out; Get reads it), and a page is bounded in bytes as well as
// in runs (ListParams.MaxBytes).
func List(ctx context.Context, db shard.Querier, p ListParams) (ListResult, error) {
	limit := p.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 0 || limit > MaxListLimit {
		return ListResult{}, fmt.Errorf("runstore: list limit %d out of 1..%d", limit, MaxListLimit)
	}
	budget := p.MaxBytes
	if budget <= 0 {
		budget = MaxListBytes
	}
	var before, statuses, queue, name any
	if p.Cursor != "" {
		pk, err := DecodeCursor(p.Cursor)
		if err != nil {
			return ListResult{}, err
		}
		before = pk
	}
	if len(p.Statuses) > 0 {
		ss := make([]string, len(p.Statuses))
		for i, s := range p.Statuses {
			ss[i] = string(s)
		}
		statuses = ss
	}
	if p.Queue != "" {
		queue = p.Queue
	}
	if p.Name != "" {
		name = p.Name
	}
	q := sqlRunList
	if len(p.Statuses) > 0 && !slices.ContainsFunc(p.Statuses, api.Status.Final) {
		q = sqlRunListUnfinished
	}
	scan := p.MaxScan
	if scan <= 0 {
		scan = DefaultListScan
	}
	// One more run than asked tells whether another page exists; the row
	// after it, when it comes, is the stretch's last (RunList.sql).
	rows, err := db.Query(ctx, q, p.Tenant, before, statuses, queue, name, limit+1, scan)
	if err != nil {
		return ListResult{}, fmt.Errorf("runstore: list runs: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[listRow])
	if err != nil {
		return ListResult{}, fmt.Errorf("runstore: list runs: %w", err)
	}
	// The stretch's last run, when the page reached it without filling:
	// the next page starts below it.
	var stopAt int64
	if n := len(got); n > 0 && got[n-1].Seen == int64(scan) {
		stopAt = got[n-1].PK
		if !got[n-1].Matched {
			got = got[:n-1]
		}
	}
	var out ListResult
	var pks []int64
	size, more := 0, false
	for _, r := range got {
		run := r.RunRow.Run(p.Shard)
		item, err := json.Marshal(api.ListItem(run))
		if err != nil {
			return ListResult{}, fmt.Errorf("runstore: list runs: %w", err)
		}
		// A run that would take the page past its budget starts the next
		// page instead; the first run of a page is taken however large,
		// so that paging always moves on.
		if len(out.Runs) == limit || (len(out.Runs) > 0 && size+len(item)+1 > budget) {
			more = true
			break
		}
		size += len(item) + 1
		out.Runs = append(out.Runs, run)
		pks = append(pks, r.PK)
	}
	switch {
	case more:
		out.NextCursor = EncodeCursor(pks[len(pks)-1])
	case stopAt > 1:
		// The stretch is read and the page is not full: the next page
		// starts below it (below pk 1 there is nothing).
		out.NextCursor = EncodeCursor(stopAt)
	}
	if out.Runs == nil {
		out.Runs = []api.Run{}
	}
	return out, nil
}
