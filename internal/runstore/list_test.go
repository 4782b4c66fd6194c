package runstore

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// List reads no output (Get does), and ends a page rather than pass its
// byte budget: with 10 KB errors and a 25 KB budget, pages of two runs,
// the cursor continuing exactly after each; a run larger than the budget
// alone still makes a page of its own.
func TestListLeavesOutOutputAndBoundsBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 7 {
		testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{Tenant: "acme"})
	}
	_, err := b.db.Exec(b.ctx, `
		UPDATE runs SET output = to_jsonb(repeat('x', 1 << 20)),
		                error = CASE WHEN pk = (SELECT min(pk) FROM runs) THEN repeat('E', 40 << 10)
		                             ELSE repeat('e', 10 << 10) END`)
	require.NoError(t, err)

	var sizes []int
	var all []string
	cursor := ""
	for {
		page, err := List(b.ctx, b.db, ListParams{Tenant: "acme", Limit: 1000, Cursor: cursor, MaxBytes: 25 << 10})
		require.NoError(t, err)
		size := 0
		for _, r := range page.Runs {
			require.Zero(t, len(r.Output), "a listing reads no output")
			require.NotNil(t, r.Error)
			item, err := json.Marshal(api.ListItem(r))
			require.NoError(t, err)
			size += len(item) + 1
			all = append(all, r.ID)
		}
		sizes = append(sizes, len(page.Runs))
		if len(page.Runs) > 1 {
			require.LessOrEqual(t, size, 25<<10)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []int{2, 2, 2, 1}, sizes)
	require.Len(t, all, 7)
	seen := map[string]bool{}
	for _, id := range all {
		require.False(t, seen[id], id)
		seen[id] = true
	}

	run, err := Get(b.ctx, b.db, "acme", all[0], 0)
	require.NoError(t, err)
	require.Greater(t, len(run.Output), 1<<20, "Get reads the output")

	// Past the limit the page ends too, whatever the budget.
	page, err := List(b.ctx, b.db, ListParams{Tenant: "acme", Limit: 3})
	require.NoError(t, err)
	require.Len(t, page.Runs, 3)
	require.NotEmpty(t, page.NextCursor)
	require.True(t, strings.HasPrefix(*page.Runs[0].Error, "e"))
}

// A listing filtered to statuses only unfinished runs show (deferred,
// queued, running) reads the tenant's unfinished runs, not its finished
// history: here the three unfinished runs are the tenant's oldest, behind
// 20,000 finished ones that a walk from the newest would pass first. A
// run stored queued whose task runs is listed under running only. A
// tenant with a backlog of 20,000 queued runs, older than 20,000 finished
// ones, gets its page of queued runs from the first entries of the index
// of unfinished runs in the listing's order, not from all of its backlog.
func TestListOfUnfinishedStatusesReadsNoHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status)
			SELECT 'acme', 'open-' || g, 'echo', 'q', '\x00', 'queued' FROM generate_series(1, 3) g`,
		`INSERT INTO tasks (run_pk, queue, state) SELECT pk, 'q', 'running' FROM runs WHERE id = 'open-3'`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
			SELECT 'acme', 'done-' || g, 'echo', 'q', '\x00', 'completed', 1, now() FROM generate_series(1, 20000) g`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status)
			SELECT 'other', 'other-' || g, 'echo', 'q', '\x00', 'queued' FROM generate_series(1, 5) g`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status)
			SELECT 'flood', 'fq-' || g, 'echo', 'q', '\x00', 'queued' FROM generate_series(1, 20000) g`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
			SELECT 'flood', 'fd-' || g, 'echo', 'q', '\x00', 'completed', 1, now() FROM generate_series(1, 20000) g`,
		`ANALYZE runs`,
		`ANALYZE tasks`,
	} {
		_, err := b.db.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	var pages int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pg_relation_size('runs') / current_setting('block_size')::int`).Scan(&pages))
	require.Greater(t, pages, 100, "the history spans the table's pages")

	// list returns the ids of one page and the heap blocks of runs its
	// transaction read.
	list := func(tenant string, statuses ...api.Status) ([]string, int) {
		t.Helper()
		tx, err := b.db.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx) //nolint:errcheck // read only
		blocks := testsvc.BlocksRead(b.ctx, t, tx, "runs")
		page, err := List(b.ctx, tx, ListParams{Tenant: tenant, Statuses: statuses})
		require.NoError(t, err)
		read := blocks()
		ids := []string{}
		for _, r := range page.Runs {
			ids = append(ids, r.ID)
		}
		return ids, read
	}
	for _, c := range []struct {
		statuses []api.Status
		want     []string
	}{
		{[]api.Status{api.StatusQueued}, []string{"open-2", "open-1"}},
		{[]api.Status{api.StatusRunning}, []string{"open-3"}},
		{[]api.Status{api.StatusDeferred, api.StatusQueued, api.StatusRunning}, []string{"open-3", "open-2", "open-1"}},
	} {
		ids, read := list("acme", c.statuses...)
		require.Equal(t, c.want, ids, "%v", c.statuses)
		require.Less(t, read, pages/20, "heap blocks of runs read for %v, of %d", c.statuses, pages)
	}
	ids, read := list("flood", api.StatusQueued)
	require.Len(t, ids, DefaultListLimit)
	require.Equal(t, "fq-20000", ids[0])
	require.Less(t, read, pages/20, "heap blocks of runs read for the backlog's first page, of %d", pages)
	// A filter a finished run can match reads as before, newest first.
	ids, _ = list("acme", api.StatusQueued, api.StatusCompleted)
	require.Len(t, ids, DefaultListLimit)
	require.Equal(t, "done-20000", ids[0])
}

// A page deep in a long history reads from its cursor down, also under a
// generic plan (the plan a prepared statement may keep once it has run a
// few times): the cursor is an index condition there, not a filter that
// reads every run above it.
func TestListPageDeepInHistoryReadsFromItsCursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
			SELECT 'acme', 'done-' || g, 'echo', 'q', '\x00', 'completed', 1, now() FROM generate_series(1, 20000) g`,
		`ANALYZE runs`,
	} {
		_, err := b.db.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	var pages int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pg_relation_size('runs') / current_setting('block_size')::int`).Scan(&pages))
	var below int64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pk FROM runs WHERE id = 'done-101'`).Scan(&below))

	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // read only
	_, err = tx.Exec(b.ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	blocks := testsvc.BlocksRead(b.ctx, t, tx, "runs")
	page, err := List(b.ctx, tx, ListParams{Tenant: "acme", Cursor: EncodeCursor(below)})
	require.NoError(t, err)
	read := blocks()
	require.Len(t, page.Runs, DefaultListLimit)
	require.Equal(t, "done-100", page.Runs[0].ID)
	require.Equal(t, "done-51", page.Runs[DefaultListLimit-1].ID)
	require.Less(t, read, pages/10, "heap blocks of runs read for the page, of %d", pages)
}

// A filtered page reads a bounded stretch of the tenant's runs, whatever
// the filter: here the tenant's three failed runs are its oldest, behind
// 20,000 completed ones, and ?status=failed (which a finished run can
// match, so the whole history is a candidate) with a stretch of 5,000
// runs gives four empty pages that each carry a cursor, then the three.
// Each page reads a quarter of the history at most; without the bound the
// first page read all of it. The listing of another tenant, interleaved,
// counts nothing toward the stretch.
func TestListFilteredPageReadsABoundedStretch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at, error)
			SELECT 'acme', 'failed-' || g, 'echo', 'q', '\x00', 'failed', 1, now(), 'boom' FROM generate_series(1, 3) g`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
			SELECT CASE WHEN g % 4 = 0 THEN 'other' ELSE 'acme' END, 'done-' || g, 'echo', 'q', '\x00', 'completed', 1, now()
			FROM generate_series(1, 26666) g`,
		`VACUUM ANALYZE runs`,
	} {
		_, err := b.db.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	var pages, acme int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pg_relation_size('runs') / current_setting('block_size')::int,
		(SELECT count(*) FROM runs WHERE tenant = 'acme') FROM runs LIMIT 1`).Scan(&pages, &acme))
	require.Equal(t, 20003, acme)

	// page reads one page in a transaction of its own, under the plan
	// mode given, and returns it with the heap blocks of runs it read.
	page := func(p ListParams, mode string) (ListResult, int) {
		t.Helper()
		tx, err := b.db.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx) //nolint:errcheck // read only
		_, err = tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
		require.NoError(t, err)
		blocks := testsvc.BlocksRead(b.ctx, t, tx, "runs")
		res, err := List(b.ctx, tx, p)
		require.NoError(t, err)
		return res, blocks()
	}
	for _, c := range []struct {
		scan  int
		mode  string
		sizes []int
	}{
		{5000, "auto", []int{0, 0, 0, 0, 3}},
		{5000, "force_generic_plan", []int{0, 0, 0, 0, 3}},
		{0, "auto", []int{0, 0, 3}}, // DefaultListScan
	} {
		var sizes []int
		var ids []string
		p := ListParams{Tenant: "acme", Statuses: []api.Status{api.StatusFailed}, MaxScan: c.scan}
		for {
			res, read := page(p, c.mode)
			sizes = append(sizes, len(res.Runs))
			for _, r := range res.Runs {
				ids = append(ids, r.ID)
			}
			if c.scan > 0 {
				require.Less(t, read, pages/3, "heap blocks of runs read by page %d (%s), of %d", len(sizes), c.mode, pages)
			}
			if res.NextCursor == "" {
				break
			}
			p.Cursor = res.NextCursor
		}
		require.Equal(t, c.sizes, sizes, "scan %d, %s", c.scan, c.mode)
		require.Equal(t, []string{"failed-3", "failed-2", "failed-1"}, ids, "scan %d, %s", c.scan, c.mode)
	}

	// A filter every run matches fills its page from the stretch's top, as
	// an unfiltered page does, and carries the last run's cursor.
	res, read := page(ListParams{Tenant: "acme", Queue: "q", MaxScan: 5000}, "force_generic_plan")
	require.Less(t, read, 10, "heap blocks of runs read by a page that fills at once")
	require.Len(t, res.Runs, DefaultListLimit)
	require.Equal(t, "done-26666", res.Runs[0].ID)
	next, err := DecodeCursor(res.NextCursor)
	require.NoError(t, err)
	var lastPK int64
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pk FROM runs WHERE id = $1`, res.Runs[DefaultListLimit-1].ID).Scan(&lastPK))
	require.Equal(t, lastPK, next)
}

// Paging through a filtered listing with any stretch returns exactly the
// runs the filter matches, newest first, each once, and ends: the bound
// on the runs a page reads changes where pages end, never what the
// listing holds. The runs of each check belong to a tenant of their own
// on one shared database.
func TestListPagesHoldExactlyTheFilteredRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	statuses := []string{"queued", "completed", "failed", "cancelled"}
	rapid.Check(t, func(rt *rapid.T) {
		tenant := testsvc.RandomName("t")
		n := rapid.IntRange(0, 40).Draw(rt, "runs")
		st := rapid.SliceOfN(rapid.SampledFrom(statuses), n, n).Draw(rt, "statuses")
		qs := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b"}), n, n).Draw(rt, "queues")
		ns := rapid.SliceOfN(rapid.SampledFrom([]string{"x", "y"}), n, n).Draw(rt, "names")
		_, err := b.db.Exec(b.ctx, `
			INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
			SELECT $1, 'r-' || lpad(o::text, 3, '0'), u.name, u.queue, '\x00', u.status, 1,
			       CASE WHEN u.status = 'queued' THEN NULL ELSE now() END
			FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(status, queue, name, o)
			ORDER BY o`, tenant, st, qs, ns)
		require.NoError(rt, err)

		var filter []api.Status
		for _, s := range statuses {
			if rapid.Bool().Draw(rt, "status "+s) {
				filter = append(filter, api.Status(s))
			}
		}
		queue := rapid.SampledFrom([]string{"", "a", "b"}).Draw(rt, "queue")
		name := rapid.SampledFrom([]string{"", "x", "y"}).Draw(rt, "name")
		var want []string
		for i := n - 1; i >= 0; i-- {
			if (len(filter) == 0 || slices.Contains(filter, api.Status(st[i]))) &&
				(queue == "" || qs[i] == queue) && (name == "" || ns[i] == name) {
				want = append(want, fmt.Sprintf("r-%03d", i+1))
			}
		}

		p := ListParams{Tenant: tenant, Statuses: filter, Queue: queue, Name: name,
			Limit: rapid.IntRange(1, 6).Draw(rt, "limit"), MaxScan: rapid.IntRange(1, 8).Draw(rt, "scan")}
		var got []string
		for pagesRead := 1; ; pagesRead++ {
			require.LessOrEqual(rt, pagesRead, n+2, "paging ends")
			res, err := List(b.ctx, b.db, p)
			require.NoError(rt, err)
			require.LessOrEqual(rt, len(res.Runs), p.Limit)
			for _, r := range res.Runs {
				got = append(got, r.ID)
			}
			if res.NextCursor == "" {
				break
			}
			p.Cursor = res.NextCursor
		}
		require.Equal(rt, want, got)
	})
}
