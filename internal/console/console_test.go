package console_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// base is the creation time runs are placed around: long before the test
// runs, so that a run started now is newer than every one of them.
var base = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// setup gives n fresh shards.
func setup(t *testing.T, n int) (context.Context, []*pgxpool.Pool) {
	t.Helper()
	dbs := make([]*pgxpool.Pool, n)
	for i := range dbs {
		dbs[i] = testsvc.NewDB(t)
	}
	return context.Background(), dbs
}

// run is a run row to insert; zero fields take defaults.
type run struct {
	tenant, id, name, queue string
	status                  api.Status
	// at is the creation time as an offset from base; nil: now().
	at *time.Duration
}

func at(d time.Duration) *time.Duration { return &d }

// addRun inserts r and returns its pk.
func addRun(t *testing.T, db *pgxpool.Pool, r run) int64 {
	t.Helper()
	if r.tenant == "" {
		r.tenant = "acme"
	}
	if r.id == "" {
		r.id = testsvc.RandomName("run-")
	}
	if r.name == "" {
		r.name = "wf"
	}
	if r.queue == "" {
		r.queue = "q"
	}
	if r.status == "" {
		r.status = api.StatusQueued
	}
	var created any
	if r.at != nil {
		created = base.Add(*r.at)
	}
	var pk int64
	require.NoError(t, db.QueryRow(context.Background(), `
		INSERT INTO runs (tenant, id, name, queue, status, request_hash, created_at)
		VALUES ($1, $2, $3, $4, $5, '\x00', coalesce($6::timestamptz, now()))
		RETURNING pk`, r.tenant, r.id, r.name, r.queue, string(r.status), created).Scan(&pk))
	return pk
}

// task is a task row to insert; zero fields take defaults.
type task struct {
	runPK  int64
	queue  string
	key    string
	state  string
	step   int
	trace  string // the traceparent of its trace_context; "" for none
	worker string
	// claimedAgo is how long before now() it was claimed; zero: never.
	claimedAgo time.Duration
}

// addTask inserts tk (a running task gets a lease) and returns its id.
func addTask(t *testing.T, db *pgxpool.Pool, tk task) int64 {
	t.Helper()
	if tk.queue == "" {
		tk.queue = "q"
	}
	if tk.state == "" {
		tk.state = "pending"
	}
	var trace, claimed, worker any
	if tk.trace != "" {
		trace = fmt.Sprintf(`{"traceparent": %q}`, tk.trace)
	}
	if tk.claimedAgo != 0 {
		claimed = tk.claimedAgo.Seconds()
	}
	if tk.worker != "" {
		worker = tk.worker
	}
	var id int64
	require.NoError(t, db.QueryRow(context.Background(), `
		INSERT INTO tasks (run_pk, queue, fairness_key, state, step, trace_context, claimed_by, claimed_at,
		                   lease_expires_at, lease_token, attempt)
		VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7,
		        now() - make_interval(secs => $8::float8),
		        CASE WHEN $4 = 'running' THEN now() + interval '1 minute' END,
		        CASE WHEN $4 = 'running' THEN gen_random_uuid() END,
		        CASE WHEN $8::float8 IS NULL THEN 0 ELSE 1 END)
		RETURNING id`, tk.runPK, tk.queue, tk.key, tk.state, tk.step, trace, worker, claimed).Scan(&id))
	return id
}

// moveOut marks run pk as being copied away to shard 9.
func moveOut(t *testing.T, db *pgxpool.Pool, pk int64) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		`INSERT INTO move_out (run_pk, tenant, moved_to) SELECT pk, tenant, 9 FROM runs WHERE pk = $1`, pk)
	require.NoError(t, err)
}

func ids(runs []api.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

// The order is created_at, then shard, then pk, all descending, whatever
// shard a run is on.
func TestListRunsOrdersAcrossShards(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 3)
	for _, r := range []struct {
		shard int
		id    string
		at    time.Duration
	}{
		{0, "s0-1", 1 * time.Second}, {1, "s1-2", 2 * time.Second}, {0, "s0-3", 3 * time.Second},
		{2, "s2-4", 4 * time.Second}, {0, "s0-5", 5 * time.Second}, {1, "s1-5", 5 * time.Second},
		{2, "s2-5a", 5 * time.Second}, {2, "s2-5b", 5 * time.Second},
	} {
		addRun(t, dbs[r.shard], run{id: r.id, at: at(r.at)})
	}
	page, err := console.ListRuns(ctx, dbs, console.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []string{"s2-5b", "s2-5a", "s1-5", "s0-5", "s2-4", "s0-3", "s1-2", "s0-1"}, ids(page.Runs))
	require.Empty(t, page.NextCursor)
	require.Empty(t, page.UnavailableShards)
	require.Equal(t, 2, page.Runs[0].Shard)
	require.Equal(t, 1, page.Runs[2].Shard)
	require.Equal(t, 0, page.Runs[3].Shard)
	require.Equal(t, base.Add(5*time.Second), page.Runs[0].CreatedAt.UTC())
	require.Equal(t, "acme", page.Runs[0].Tenant)
	require.Equal(t, api.StatusQueued, page.Runs[0].Status)
}

func TestListRunsFilters(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	addRun(t, dbs[0], run{id: "a", tenant: "acme", queue: "q1", name: "wf1", status: api.StatusQueued, at: at(1 * time.Second)})
	addRun(t, dbs[1], run{id: "b", tenant: "acme", queue: "q2", name: "wf1", status: api.StatusFailed, at: at(2 * time.Second)})
	addRun(t, dbs[0], run{id: "c", tenant: "globex", queue: "q1", name: "wf2", status: api.StatusDeferred, at: at(3 * time.Second)})
	addRun(t, dbs[1], run{id: "d", tenant: "globex", queue: "q2", name: "wf2", status: api.StatusCompleted, at: at(4 * time.Second)})
	addRun(t, dbs[1], run{id: "e", tenant: "acme", queue: "q1", name: "wf2", status: api.StatusRunning, at: at(5 * time.Second)})
	moved := addRun(t, dbs[0], run{id: "moved", tenant: "acme", queue: "q1", name: "wf1", at: at(6 * time.Second)})
	moveOut(t, dbs[0], moved)

	for _, c := range []struct {
		name string
		f    console.RunFilter
		want []string
	}{
		{"none", console.RunFilter{}, []string{"e", "d", "c", "b", "a"}},
		{"tenant", console.RunFilter{Tenant: "acme"}, []string{"e", "b", "a"}},
		{"queue", console.RunFilter{Queue: "q1"}, []string{"e", "c", "a"}},
		{"name", console.RunFilter{Name: "wf2"}, []string{"e", "d", "c"}},
		{"statuses", console.RunFilter{Statuses: []api.Status{api.StatusFailed, api.StatusDeferred}}, []string{"c", "b"}},
		{"all of them", console.RunFilter{Tenant: "acme", Queue: "q1", Name: "wf2",
			Statuses: []api.Status{api.StatusRunning}}, []string{"e"}},
		{"nothing matches", console.RunFilter{Tenant: "initech"}, []string{}},
	} {
		page, err := console.ListRuns(ctx, dbs, c.f)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, ids(page.Runs), c.name)
		require.Empty(t, page.NextCursor, c.name)
	}
}

// A claim writes only its task: a run stored queued whose task runs is
// shown running, with that attempt and its claim time, on the list (and
// under the running filter, not the queued one) and on its own page; a
// run stored queued with no running task stays queued.
func TestRunsShowTheAttemptInFlight(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	db := dbs[0]
	busy := addRun(t, db, run{id: "busy", tenant: "acme", at: at(time.Second)})
	tk := addTask(t, db, task{runPK: busy, state: "running", worker: "w1", claimedAgo: 3 * time.Second})
	idle := addRun(t, db, run{id: "idle", tenant: "acme", at: at(2 * time.Second)})
	addTask(t, db, task{runPK: idle})
	var claimed time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT claimed_at FROM tasks WHERE id = $1`, tk).Scan(&claimed))

	for _, c := range []struct {
		statuses []api.Status
		want     []string
	}{
		{nil, []string{"idle", "busy"}},
		{[]api.Status{api.StatusRunning}, []string{"busy"}},
		{[]api.Status{api.StatusQueued}, []string{"idle"}},
	} {
		page, err := console.ListRuns(ctx, dbs, console.RunFilter{Statuses: c.statuses})
		require.NoError(t, err)
		require.Equal(t, c.want, ids(page.Runs), "statuses %v", c.statuses)
	}
	page, err := console.ListRuns(ctx, dbs, console.RunFilter{})
	require.NoError(t, err)
	listed := page.Runs[1]
	require.Equal(t, api.StatusRunning, listed.Status)
	require.Equal(t, 1, listed.Attempts)
	require.NotNil(t, listed.ClaimedAt)
	require.True(t, claimed.Equal(listed.ClaimedAt.Time))
	require.Equal(t, api.StatusQueued, page.Runs[0].Status)
	require.Zero(t, page.Runs[0].Attempts)
	require.Nil(t, page.Runs[0].ClaimedAt)

	d, err := console.Inspect(ctx, db, 0, "acme", "busy")
	require.NoError(t, err)
	require.Equal(t, listed, d.Run)
	require.Nil(t, d.Run.Waiting, "a running run does not wait")
}

// Paging with any limit gives every run once, each shard's runs newest pk
// first from page to page and each page newest created_at first, even while new runs start
// between the pages: their pks are above every shard's bound, so they
// belong to no later page of the listing. Creation times disagree with pk
// order on purpose (a start's created_at is its transaction's start, a
// moved run keeps its time), so the merge must not skip a shard's newer
// pk for an older one that was created later.
func TestListRunsPagesExactlyWhileRunsArrive(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		limit  int
		tenant string
	}{{1, ""}, {3, ""}, {7, ""}, {40, ""}, {1, "acme"}, {3, "acme"}, {7, "acme"}, {40, "acme"}} {
		t.Run(fmt.Sprintf("limit %d tenant %q", c.limit, c.tenant), func(t *testing.T) {
			t.Parallel()
			ctx, dbs := setup(t, 3)
			type placed struct {
				shard int
				pk    int64
				at    time.Duration
			}
			rnd := rand.New(rand.NewPCG(uint64(c.limit), 7))
			want := map[string]placed{}
			for i := range 40 {
				// Times repeat across shards and within a shard, so that
				// ties are broken by shard and pk at page edges.
				id, tenant := fmt.Sprintf("r%02d", i), []string{"acme", "globex"}[i%2]
				p := placed{shard: i % 3, at: time.Duration(rnd.IntN(10)) * time.Second}
				p.pk = addRun(t, dbs[p.shard], run{id: id, tenant: tenant, at: at(p.at)})
				if c.tenant == "" || tenant == c.tenant {
					want[id] = p
				}
			}

			got := map[string]placed{}
			// shownBelow is each shard's smallest pk of the pages before:
			// a later page lists only runs below it.
			shownBelow := map[int]int64{}
			cursor := ""
			for pages := 0; ; pages++ {
				require.Less(t, pages, 100)
				p, err := console.ListRuns(ctx, dbs, console.RunFilter{Tenant: c.tenant, Limit: c.limit, Cursor: cursor})
				require.NoError(t, err)
				require.Empty(t, p.UnavailableShards)
				require.LessOrEqual(t, len(p.Runs), c.limit)
				if p.NextCursor != "" {
					require.Len(t, p.Runs, c.limit, "only the last page is short")
				}
				var prev *placed
				for _, r := range p.Runs {
					w, ok := want[r.ID]
					require.True(t, ok, "%s is not a run of the listing", r.ID)
					require.Equal(t, w.shard, r.Shard)
					require.Equal(t, base.Add(w.at), r.CreatedAt.UTC())
					require.NotContains(t, got, r.ID, "listed twice")
					got[r.ID] = w
					if last, ok := shownBelow[w.shard]; ok {
						require.Less(t, w.pk, last, "shard %d out of pk order across pages", w.shard)
					}
					if prev != nil {
						require.True(t, prev.at > w.at || prev.at == w.at &&
							(prev.shard > w.shard || prev.shard == w.shard && prev.pk > w.pk),
							"page out of order at %s", r.ID)
					}
					prev = &w
				}
				for _, r := range p.Runs {
					w := want[r.ID]
					if last, ok := shownBelow[w.shard]; !ok || w.pk < last {
						shownBelow[w.shard] = w.pk
					}
				}
				// A run started now on every shard, between two pages.
				for _, db := range dbs {
					addRun(t, db, run{tenant: cmp.Or(c.tenant, "acme")})
				}
				if p.NextCursor == "" {
					break
				}
				cursor = p.NextCursor
			}
			require.Equal(t, want, got)
		})
	}
}

// Each shard is read in pk order, so a run created early but written
// late (a higher pk) comes before the shard's older pks, while a page
// still reads newest first by creation time.
func TestListRunsShardPKOrder(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	addRun(t, dbs[0], run{id: "s0-old-pk", at: at(5 * time.Second)})
	addRun(t, dbs[0], run{id: "s0-new-pk", at: at(1 * time.Second)})
	addRun(t, dbs[1], run{id: "s1", at: at(3 * time.Second)})

	whole, err := console.ListRuns(ctx, dbs, console.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []string{"s0-old-pk", "s1", "s0-new-pk"}, ids(whole.Runs))
	require.Empty(t, whole.NextCursor)

	var got []string
	cursor := ""
	for {
		p, err := console.ListRuns(ctx, dbs, console.RunFilter{Limit: 1, Cursor: cursor})
		require.NoError(t, err)
		got = append(got, ids(p.Runs)...)
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	require.Equal(t, []string{"s1", "s0-new-pk", "s0-old-pk"}, got)
}

func TestListRunsDefaultLimitAndBadArguments(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	_, err := dbs[0].Exec(ctx, `
		INSERT INTO runs (tenant, id, name, queue, request_hash, created_at)
		SELECT 'acme', 'r' || i, 'wf', 'q', '\x00', $1::timestamptz + i * interval '1 second'
		FROM generate_series(1, 60) i`, base)
	require.NoError(t, err)

	page, err := console.ListRuns(ctx, dbs, console.RunFilter{})
	require.NoError(t, err)
	require.Len(t, page.Runs, console.DefaultRunLimit)
	require.Equal(t, "r60", page.Runs[0].ID)
	require.NotEmpty(t, page.NextCursor)
	rest, err := console.ListRuns(ctx, dbs, console.RunFilter{Cursor: page.NextCursor})
	require.NoError(t, err)
	require.Len(t, rest.Runs, 60-console.DefaultRunLimit)
	require.Equal(t, "r10", rest.Runs[0].ID)
	require.Empty(t, rest.NextCursor)

	for _, limit := range []int{-1, console.MaxRunLimit + 1} {
		_, err := console.ListRuns(ctx, dbs, console.RunFilter{Limit: limit})
		require.ErrorContains(t, err, "limit")
	}
	_, err = console.ListRuns(ctx, dbs, console.RunFilter{Statuses: []api.Status{api.StatusQueued, "bogus"}})
	require.ErrorContains(t, err, "status")

	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, cursor := range []string{
		"!!!",             // not base64url
		enc("c1:2:1:0:3"), // the old version
		enc("c2:2:17"),    // one place for two shards
		enc("c2:2:17,y"),  // neither pk, "-" nor "x"
		enc("c2:2:0,-"),   // no run is below pk 0
		enc("c2:two:-,-"), // no shard count
	} {
		_, err := console.ListRuns(ctx, dbs, console.RunFilter{Cursor: cursor})
		require.ErrorIs(t, err, console.ErrBadCursor, cursor)
	}
	// A cursor of a listing over two shards means nothing over one.
	_, err = console.ListRuns(ctx, dbs[:1], console.RunFilter{Cursor: page.NextCursor})
	require.ErrorIs(t, err, console.ErrBadCursor)
	_, err = console.ListRuns(ctx, dbs[:1], console.RunFilter{Cursor: enc("c2:2:-,-")})
	require.ErrorIs(t, err, console.ErrBadCursor)
	// Every shard exhausted: an empty last page.
	done, err := console.ListRuns(ctx, dbs, console.RunFilter{Cursor: enc("c2:2:x,x")})
	require.NoError(t, err)
	require.Empty(t, done.Runs)
	require.Empty(t, done.NextCursor)
}

// downPool is a pool of a server that does not exist.
func downPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	down, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(down.Close)
	return down
}

// A shard that does not answer is named; the others still list.
func TestListRunsUnavailableShard(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	down := downPool(t)
	addRun(t, dbs[0], run{id: "a", at: at(time.Second)})
	page, err := console.ListRuns(ctx, []*pgxpool.Pool{dbs[0], down}, console.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, ids(page.Runs))
	require.Equal(t, []int{1}, page.UnavailableShards)
	require.NotEmpty(t, page.NextCursor, "the missing shard is still to be read")

	q, err := console.QueueDepths(ctx, []*pgxpool.Pool{down, dbs[0]}, "q")
	require.NoError(t, err)
	require.Equal(t, []int{0}, q.UnavailableShards)
	require.Len(t, q.Queues, 1)
	require.Equal(t, 1, q.Queues[0].Shard)
}

// A shard missing from a page keeps its place in the cursor: once it
// answers again, its runs continue from where they stopped, none lost and
// none twice, whether it was missing on the first page or a later one.
func TestListRunsUnavailableShardKeepsItsPlace(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	down := downPool(t)
	for i := range 6 {
		addRun(t, dbs[0], run{id: fmt.Sprintf("a%d", i), at: at(time.Duration(i) * time.Second)})
		addRun(t, dbs[1], run{id: fmt.Sprintf("b%d", i), at: at(time.Duration(i)*time.Second + time.Millisecond)})
	}
	up := dbs
	broken := []*pgxpool.Pool{dbs[0], down}

	list := func(pools []*pgxpool.Pool, cursor string) console.RunPage {
		t.Helper()
		p, err := console.ListRuns(ctx, pools, console.RunFilter{Limit: 2, Cursor: cursor})
		require.NoError(t, err)
		return p
	}
	p := list(up, "")
	require.Equal(t, []string{"b5", "a5"}, ids(p.Runs))
	p = list(broken, p.NextCursor)
	require.Equal(t, []string{"a4", "a3"}, ids(p.Runs))
	require.Equal(t, []int{1}, p.UnavailableShards)
	p = list(up, p.NextCursor)
	require.Equal(t, []string{"b4", "b3"}, ids(p.Runs))
	require.Empty(t, p.UnavailableShards)

	// Shard 1 down from the first page on; new runs started meanwhile on
	// the shard that answered stay out of the listing.
	var got []string
	p = list(broken, "")
	require.Equal(t, []string{"a5", "a4"}, ids(p.Runs))
	got = append(got, ids(p.Runs)...)
	addRun(t, dbs[0], run{id: "late"})
	for p.NextCursor != "" {
		p = list(up, p.NextCursor)
		got = append(got, ids(p.Runs)...)
	}
	require.ElementsMatch(t, []string{"a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2", "b3", "b4", "b5"}, got)
}

const (
	traceHex    = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceparent = "00-" + traceHex + "-00f067aa0ba902b7-01"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	db := dbs[1]
	pk := addRun(t, db, run{id: "r1", tenant: "acme", queue: "q", status: api.StatusRunning, at: at(time.Second)})
	// Stored as a run of two steps keeps it while its second step runs: the
	// first step's attempt counted (by its continuation), the second one's
	// in flight, which the read adds (runs_seen).
	_, err := db.Exec(ctx, `UPDATE runs SET input = '{"n": 1}', max_attempts = 5, attempts = 1 WHERE pk = $1`, pk)
	require.NoError(t, err)
	first := addTask(t, db, task{runPK: pk, state: "done", trace: traceparent, worker: "w1", claimedAgo: 30 * time.Second})
	second := addTask(t, db, task{runPK: pk, state: "running", step: 1, worker: "w2", claimedAgo: 2 * time.Second,
		trace: "00-ffffffffffffffffffffffffffffffff-00f067aa0ba902b7-01"})
	// Another tenant's run with the same id, on the same shard.
	addRun(t, db, run{id: "r1", tenant: "globex"})

	d, err := console.Inspect(ctx, db, 1, "acme", "r1")
	require.NoError(t, err)
	require.Equal(t, "r1", d.Run.ID)
	require.Equal(t, "acme", d.Run.Tenant)
	require.Equal(t, 1, d.Run.Shard)
	require.Equal(t, api.StatusRunning, d.Run.Status)
	require.Equal(t, 2, d.Run.Attempts)
	require.Equal(t, 5, d.MaxAttempts)
	require.JSONEq(t, `{"n": 1}`, string(d.Input))
	require.Equal(t, traceHex, d.TraceID, "the trace of the first task")
	require.False(t, d.Moving)
	require.Len(t, d.Tasks, 2)
	require.Equal(t, first, d.Tasks[0].ID)
	require.Equal(t, "done", d.Tasks[0].State)
	require.Equal(t, "w1", d.Tasks[0].ClaimedBy)
	require.Equal(t, 1, d.Tasks[0].Attempt)
	require.NotNil(t, d.Tasks[0].ClaimedAt)
	require.True(t, d.Tasks[0].ClaimedAt.Before(*d.Tasks[1].ClaimedAt))
	require.False(t, d.Tasks[0].DueAt.IsZero())
	require.False(t, d.Tasks[0].CreatedAt.IsZero())
	require.Equal(t, second, d.Tasks[1].ID)
	require.Equal(t, 1, d.Tasks[1].Step)
	require.Equal(t, "running", d.Tasks[1].State)

	moveOut(t, db, pk)
	d, err = console.Inspect(ctx, db, 1, "acme", "r1")
	require.NoError(t, err)
	require.True(t, d.Moving)

	_, err = console.Inspect(ctx, db, 1, "acme", "nope")
	require.ErrorIs(t, err, runstore.ErrNotFound)
	_, err = console.Inspect(ctx, db, 1, "initech", "r1")
	require.ErrorIs(t, err, runstore.ErrNotFound)
	_, err = console.Inspect(ctx, dbs[0], 0, "acme", "r1")
	require.ErrorIs(t, err, runstore.ErrNotFound)
}

// TraceID is only a well-formed, valid W3C trace id; a run without a task
// (a deferred one) or without trace context has none.
func TestInspectTraceID(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	db := dbs[0]
	for i, c := range []struct {
		trace string
		want  string
	}{
		{traceparent, traceHex},
		{"", ""},
		{"00-" + "4BF92F3577B34DA6A3CE929D0E0E4736" + "-00f067aa0ba902b7-01", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01", ""},
		{"00-" + traceHex + "-00f067aa0ba902b7", ""},
		{"00-" + traceHex + "-00f067aa0ba902b7-01-extra", ""},
		{"ff-" + traceHex + "-00f067aa0ba902b7-01", ""},
		{"junk", ""},
	} {
		id := fmt.Sprintf("r%d", i)
		pk := addRun(t, db, run{id: id})
		addTask(t, db, task{runPK: pk, trace: c.trace})
		d, err := console.Inspect(ctx, db, 0, "acme", id)
		require.NoError(t, err)
		require.Equal(t, c.want, d.TraceID, c.trace)
	}
	addRun(t, db, run{id: "deferred", status: api.StatusDeferred})
	d, err := console.Inspect(ctx, db, 0, "acme", "deferred")
	require.NoError(t, err)
	require.Empty(t, d.TraceID)
	require.Empty(t, d.Tasks)
	require.Equal(t, api.StatusDeferred, d.Run.Status)
}

// A long chain of continuations lists a bounded number of tasks: the
// newest, oldest first; the trace is still the first task's.
func TestInspectCapsTasks(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	db := dbs[0]
	pk := addRun(t, db, run{id: "long"})
	addTask(t, db, task{runPK: pk, state: "done", trace: traceparent})
	_, err := db.Exec(ctx, `
		INSERT INTO tasks (run_pk, queue, state, step, continuation)
		SELECT $1, 'q', 'done', i, true FROM generate_series(1, 250) i`, pk)
	require.NoError(t, err)
	d, err := console.Inspect(ctx, db, 0, "acme", "long")
	require.NoError(t, err)
	require.Len(t, d.Tasks, 200)
	require.Equal(t, 51, d.Tasks[0].Step)
	require.Equal(t, 250, d.Tasks[199].Step)
	require.Equal(t, traceHex, d.TraceID)
}

func TestQueuesAndDepths(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	s0, s1 := dbs[0], dbs[1]
	r0 := addRun(t, s0, run{})
	for _, tk := range []task{
		{queue: "a", state: "pending"}, {queue: "a", state: "pending"},
		{queue: "a", state: "scheduled"},
		{queue: "a", state: "running", claimedAgo: 10 * time.Second},
		{queue: "a", state: "done", claimedAgo: 20 * time.Second},
		{queue: "a", state: "done", claimedAgo: 2 * time.Minute}, // before the last minute
		{queue: "e", state: "done", claimedAgo: 2 * time.Minute}, // only history: not listed
	} {
		tk.runPK = r0
		addTask(t, s0, tk)
	}
	moving := addRun(t, s0, run{})
	addTask(t, s0, task{runPK: moving, queue: "a", state: "moving"})
	moveOut(t, s0, moving)
	_, err := s0.Exec(ctx, `INSERT INTO queue_pauses (queue, paused_by) VALUES ('b', 'ops')`)
	require.NoError(t, err)
	_, err = s0.Exec(ctx, `INSERT INTO weight_overrides (queue, key, weight) VALUES ('c', 'k', 2)`)
	require.NoError(t, err)
	_, err = s0.Exec(ctx, `INSERT INTO fair_state (queue, key) VALUES ('d', 'k')`)
	require.NoError(t, err)
	r1 := addRun(t, s1, run{})
	addTask(t, s1, task{runPK: r1, queue: "a", state: "pending"})
	addTask(t, s1, task{runPK: r1, queue: "z", state: "scheduled"})
	var pausedAt time.Time
	require.NoError(t, s1.QueryRow(ctx,
		`INSERT INTO queue_pauses (queue, paused_by) VALUES ('a', 'alice') RETURNING paused_at`).Scan(&pausedAt))

	list, err := console.Queues(ctx, dbs, 0)
	require.NoError(t, err)
	require.False(t, list.Truncated)
	require.Empty(t, list.UnavailableShards)
	type key struct {
		queue string
		shard int
	}
	var got []key
	for _, q := range list.Queues {
		got = append(got, key{q.Queue, q.Shard})
	}
	require.Equal(t, []key{{"a", 0}, {"a", 1}, {"b", 0}, {"c", 0}, {"d", 0}, {"z", 1}}, got)
	a0 := list.Queues[0]
	require.Equal(t, console.QueueDepth{Queue: "a", Shard: 0, Scheduled: 1, Pending: 2, Running: 1, Moving: 1,
		ClaimsLastMinute: 2}, a0)
	a1 := list.Queues[1]
	require.NotNil(t, a1.Paused)
	require.Equal(t, "alice", a1.Paused.By)
	require.True(t, pausedAt.Equal(a1.Paused.At))
	a1.Paused = nil
	require.Equal(t, console.QueueDepth{Queue: "a", Shard: 1, Pending: 1}, a1)
	require.Equal(t, "ops", list.Queues[2].Paused.By)
	require.Equal(t, console.QueueDepth{Queue: "c", Shard: 0}, list.Queues[3])
	require.Equal(t, console.QueueDepth{Queue: "z", Shard: 1, Scheduled: 1}, list.Queues[5])

	short, err := console.Queues(ctx, dbs, 2)
	require.NoError(t, err)
	require.True(t, short.Truncated)
	got = nil
	for _, q := range short.Queues {
		got = append(got, key{q.Queue, q.Shard})
	}
	require.Equal(t, []key{{"a", 0}, {"a", 1}, {"b", 0}, {"z", 1}}, got)
	_, err = console.Queues(ctx, dbs, -1)
	require.ErrorContains(t, err, "limit")

	one, err := console.QueueDepths(ctx, dbs, "a")
	require.NoError(t, err)
	require.Len(t, one.Queues, 2)
	require.Equal(t, a0, one.Queues[0])
	require.Equal(t, "alice", one.Queues[1].Paused.By)
	require.Equal(t, 1, one.Queues[1].Pending)

	none, err := console.QueueDepths(ctx, dbs, "nothing")
	require.NoError(t, err)
	require.Equal(t, []console.QueueDepth{{Queue: "nothing", Shard: 0}, {Queue: "nothing", Shard: 1}}, none.Queues)
	_, err = console.QueueDepths(ctx, dbs, "")
	require.ErrorContains(t, err, "queue")
}

func TestClaimShares(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	// Buckets of 10 s over the last minute: a claim 5 s ago is in bucket
	// 5, 15 s ago in 4, 25 s ago in 3, 55 s ago in 0, 65 s ago outside;
	// each sits mid-bucket, seconds away from an edge.
	claims := map[int][]struct {
		key string
		ago time.Duration
		n   int
	}{
		0: {{"acme", 5 * time.Second, 3}, {"acme/x", 15 * time.Second, 2}, {"globex", 25 * time.Second, 1},
			{"acmex", 55 * time.Second, 1}, {"old", 65 * time.Second, 1}},
		1: {{"acme", 5 * time.Second, 2}, {"globex", 55 * time.Second, 4}, {"zeta", 5 * time.Second, 1}},
	}
	for shard, cs := range claims {
		pk := addRun(t, dbs[shard], run{})
		for _, c := range cs {
			for range c.n {
				addTask(t, dbs[shard], task{runPK: pk, queue: "q", key: c.key, state: "done", claimedAgo: c.ago})
			}
		}
		// Claims of another queue and a task never claimed do not count.
		addTask(t, dbs[shard], task{runPK: pk, queue: "other", key: "acme", state: "done", claimedAgo: 5 * time.Second})
		addTask(t, dbs[shard], task{runPK: pk, queue: "q", key: "acme"})
	}
	var before time.Time
	require.NoError(t, dbs[0].QueryRow(ctx, `SELECT now()`).Scan(&before))

	s, err := console.ClaimShares(ctx, dbs, "q", 10*time.Second, 6, 2, "")
	require.NoError(t, err)
	var after time.Time
	require.NoError(t, dbs[0].QueryRow(ctx, `SELECT now()`).Scan(&after))
	require.Equal(t, 10*time.Second, s.Bucket)
	require.False(t, s.End.Before(before))
	require.False(t, s.End.After(after))
	require.Empty(t, s.UnavailableShards)
	require.Equal(t, []string{"acme", "globex", console.OtherKey}, s.Keys)
	require.Equal(t, [][]int{
		{0, 0, 0, 0, 0, 5},
		{4, 0, 0, 1, 0, 0},
		{1, 0, 0, 0, 2, 1},
	}, s.Counts)
	require.Equal(t, []int{5, 0, 0, 1, 2, 6}, s.Total)

	s, err = console.ClaimShares(ctx, dbs, "q", 10*time.Second, 6, 10, "")
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "globex", "acme/x", "acmex", "zeta"}, s.Keys)
	require.Equal(t, []int{5, 0, 0, 1, 2, 6}, s.Total)

	// Only acme's keys: "acmex" is another tenant's.
	s, err = console.ClaimShares(ctx, dbs, "q", 10*time.Second, 6, 1, "acme")
	require.NoError(t, err)
	require.Equal(t, []string{"acme", console.OtherKey}, s.Keys)
	require.Equal(t, [][]int{{0, 0, 0, 0, 0, 5}, {0, 0, 0, 0, 2, 0}}, s.Counts)
	require.Equal(t, []int{0, 0, 0, 0, 2, 5}, s.Total)

	// One bucket of a minute and a half takes the old claim too.
	s, err = console.ClaimShares(ctx, dbs, "q", 90*time.Second, 1, 50, "")
	require.NoError(t, err)
	require.Equal(t, []int{15}, s.Total)

	s, err = console.ClaimShares(ctx, dbs, "empty", 10*time.Second, 3, 5, "")
	require.NoError(t, err)
	require.Empty(t, s.Keys)
	require.Equal(t, []int{0, 0, 0}, s.Total)
	require.False(t, s.End.IsZero())

	for _, c := range []struct {
		bucket           time.Duration
		buckets, maxKeys int
		field            string
	}{
		{500 * time.Millisecond, 6, 5, "bucket"},
		{10 * time.Second, 0, 5, "buckets"},
		{10 * time.Second, 361, 5, "buckets"},
		{10 * time.Second, 6, 0, "maxKeys"},
		{10 * time.Second, 6, 51, "maxKeys"},
	} {
		_, err := console.ClaimShares(ctx, dbs, "q", c.bucket, c.buckets, c.maxKeys, "")
		require.ErrorContains(t, err, c.field)
	}
}

// A queued run's page data says why it waits; a running one's does not.
func TestInspectWaiting(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	db := dbs[0]
	pk := addRun(t, db, run{id: "q1", tenant: "acme", queue: "q"})
	addTask(t, db, task{runPK: pk, state: "pending"})
	d, err := console.Inspect(ctx, db, 0, "acme", "q1")
	require.NoError(t, err)
	require.NotNil(t, d.Run.Waiting)
	require.Equal(t, api.WaitNoWorker, d.Run.Waiting.Reason, "no worker announced queue q")

	_, err = db.Exec(ctx, `INSERT INTO worker_presence (worker, queue, live_until) VALUES ('w1', 'q', now() + interval '1 minute')`)
	require.NoError(t, err)
	d, err = console.Inspect(ctx, db, 0, "acme", "q1")
	require.NoError(t, err)
	require.Equal(t, api.WaitNext, d.Run.Waiting.Reason)

	rpk := addRun(t, db, run{id: "r1", tenant: "acme", queue: "q", status: api.StatusRunning})
	addTask(t, db, task{runPK: rpk, state: "running", worker: "w1", claimedAgo: time.Second})
	d, err = console.Inspect(ctx, db, 0, "acme", "r1")
	require.NoError(t, err)
	require.Nil(t, d.Run.Waiting)
}
