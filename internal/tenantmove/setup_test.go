package tenantmove

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// bundle is three fresh shards and the options of a move over them.
type bundle struct {
	ctx context.Context
	dbs []*pgxpool.Pool
	o   Options
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: context.Background()}
	for range 3 {
		// Small pools: the package's tests run beside other packages'
		// on one server, whose connections are few.
		cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
		require.NoError(t, err)
		cfg.MaxConns = 3
		pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		b.dbs = append(b.dbs, pool)
	}
	b.o = Options{Shards: b.dbs, MaxRuns: 10000, Batch: 3, Poll: 5 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return b
}

// home records tenant's home as shard s, as a gateway would have.
func (b *bundle) home(t *testing.T, tenant string, s int) {
	t.Helper()
	_, err := directory.Place(b.ctx, b.dbs[0], tenant, s)
	require.NoError(t, err)
}

// runKind says what state a fixture run is left in.
type runKind int

const (
	queued runKind = iota
	scheduled
	running
	completed
	failed
	cancelled
)

// fixture is a run made on a shard.
type fixture struct {
	id    string
	kind  runKind
	shard int
	task  int64
	token [16]byte
}

// makeRun makes one run of tenant on shard s in the given state; a running
// one keeps its lease in the returned fixture.
func (b *bundle) makeRun(t *testing.T, s int, tenant, id string, kind runKind) fixture {
	t.Helper()
	db := b.dbs[s]
	o := testfactory.TaskOpts{Run: testfactory.RunOpts{Tenant: tenant, ID: id}, Key: tenant}
	if kind == scheduled {
		o.DueAt = time.Now().Add(time.Hour)
	}
	_, task := testfactory.Task(b.ctx, t, db, o)
	f := fixture{id: id, kind: kind, shard: s, task: task}
	_, err := db.Exec(b.ctx, `UPDATE runs SET input = $2::jsonb WHERE tenant = $1 AND id = $3`, tenant,
		`{"n":"`+id+`"}`, id)
	require.NoError(t, err)
	if kind == queued || kind == scheduled {
		return f
	}
	if kind == cancelled {
		_, err := runstore.Cancel(b.ctx, db, tenant, id, s, "test")
		require.NoError(t, err)
		return f
	}
	res, err := claim.ClaimByID(b.ctx, db, task, claim.Request{Queue: "q", Worker: "w"})
	require.NoError(t, err)
	require.True(t, res.OK)
	f.token = res.Task.LeaseToken
	switch kind {
	case completed:
		require.NoError(t, claim.Complete(b.ctx, db, task, res.Task.LeaseToken, json.RawMessage(`{"done":"`+id+`"}`)))
	case failed:
		retried, err := claim.Fail(b.ctx, db, task, res.Task.LeaseToken, claim.FailOptions{Error: "boom"})
		require.NoError(t, err)
		require.False(t, retried)
	}
	return f
}

// runRow is what the tests compare of a run across shards.
type runRow struct {
	Tenant   string          `db:"tenant"`
	ID       string          `db:"id"`
	Status   string          `db:"status"`
	Attempts int             `db:"attempts"`
	Input    json.RawMessage `db:"input"`
	Output   json.RawMessage `db:"output"`
}

// runsOf reads the tenant's runs on shard s by id.
func (b *bundle) runsOf(t *testing.T, s int, tenant string) map[string]runRow {
	t.Helper()
	rows, err := b.dbs[s].Query(b.ctx, `SELECT tenant, id, status, attempts, input, output FROM runs WHERE tenant = $1`, tenant)
	require.NoError(t, err)
	out := map[string]runRow{}
	for rows.Next() {
		var r runRow
		require.NoError(t, rows.Scan(&r.Tenant, &r.ID, &r.Status, &r.Attempts, &r.Input, &r.Output))
		out[r.ID] = r
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *bundle) count(t *testing.T, s int, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.dbs[s].QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// invariants checks what must hold on every shard once no move is in
// progress: each run of ids exactly once (on shard at, when at >= 0),
// counts equal to a recount for every tenant, no task moving, no move_out
// or tenant_away row left.
func (b *bundle) invariants(t *testing.T, tenant string, ids []string, at int) {
	t.Helper()
	seen := map[string]int{}
	for s := range b.dbs {
		for id := range b.runsOf(t, s, tenant) {
			seen[id]++
			if at >= 0 {
				require.Equal(t, at, s, "run %s is on shard %d", id, s)
			}
		}
		require.Zero(t, b.count(t, s, `SELECT count(*) FROM tasks WHERE state = 'moving'`), "shard %d", s)
		require.Zero(t, b.count(t, s, `SELECT count(*) FROM move_out`), "shard %d", s)
		require.Zero(t, b.count(t, s, `SELECT count(*) FROM tenant_away`), "shard %d", s)
		drift, err := tenantcap.Drift(b.ctx, b.dbs[s])
		require.NoError(t, err)
		require.Empty(t, drift, "shard %d: counts differ from a recount", s)
	}
	for _, id := range ids {
		require.Equal(t, 1, seen[id], "run %s", id)
	}
	require.Len(t, seen, len(ids))
}
