package runstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

type bundle struct {
	ctx context.Context
	db  *pgxpool.Pool
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{ctx: context.Background(), db: testsvc.NewDB(t)}
}

// startOpts shapes a test start; zero values give a valid one.
type startOpts struct {
	ID, Tenant, Queue string
	Input             string
	FairnessKey       *string
}

func (b bundle) start(t *testing.T, o startOpts) (StartResult, error) {
	t.Helper()
	if o.ID == "" {
		o.ID = testsvc.RandomName("run-")
	}
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	if o.Queue == "" {
		o.Queue = "shared"
	}
	if o.Input == "" {
		o.Input = `{"n":1}`
	}
	req := api.StartRequest{ID: o.ID, Name: "echo", Queue: o.Queue, Input: json.RawMessage(o.Input), FairnessKey: o.FairnessKey}
	require.Nil(t, req.Validate())
	return Start(b.ctx, b.db, StartParams{Tenant: o.Tenant, Shard: 1, Req: req})
}

// running is the tenant's count of unfinished runs on the shard.
func (b bundle) running(t *testing.T, tenant string) int {
	t.Helper()
	return b.count(t, `SELECT running FROM tenant_running WHERE tenant = $1`, tenant)
}

func (b bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, query, args...).Scan(&n))
	return n
}

func TestStartWritesRunTaskAndCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "tenant-42"
	res, err := b.start(t, startOpts{ID: "r1", FairnessKey: &key})
	require.NoError(t, err)
	require.True(t, res.Created)
	require.NotZero(t, res.TaskID)
	run := res.Run
	require.Equal(t, "r1", run.ID)
	require.Equal(t, "acme", run.Tenant)
	require.Equal(t, 1, run.Shard)
	require.Equal(t, "tenant-42", run.FairnessKey)
	require.Equal(t, api.StatusQueued, run.Status)
	require.Nil(t, run.ClaimedAt)
	require.False(t, run.CreatedAt.IsZero())

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tasks WHERE fairness_key = 'tenant-42'`))
	require.Equal(t, 1, b.running(t, "acme"))

	got, err := Get(b.ctx, b.db, "acme", "r1", 1)
	require.NoError(t, err)
	require.Equal(t, run, got)
	_, err = Get(b.ctx, b.db, "globex", "r1", 1)
	require.ErrorIs(t, err, ErrNotFound, "another tenant's run is not found")
}

func TestStartReplayAndConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.start(t, startOpts{ID: "r1", Input: `{"a":1,"b":[1,2]}`})
	require.NoError(t, err)

	// Same request, other spacing and key order: a replay.
	again, err := b.start(t, startOpts{ID: "r1", Input: `{ "b": [1, 2], "a": 1 }`})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, first.Run, again.Run)

	_, err = b.start(t, startOpts{ID: "r1", Input: `{"a":2}`})
	require.ErrorIs(t, err, ErrConflict)

	// The same id under another tenant is another run.
	other, err := b.start(t, startOpts{ID: "r1", Tenant: "globex"})
	require.NoError(t, err)
	require.True(t, other.Created)

	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM tasks`))
	require.Equal(t, 1, b.running(t, "acme"))
}

// Many starts of one id at the same instant make exactly one run.
func TestStartRaceMakesOneRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 16
	created := make([]bool, n)
	p := pool.New().WithErrors()
	for i := range n {
		p.Go(func() error {
			res, err := b.start(t, startOpts{ID: "same"})
			created[i] = res.Created
			return err
		})
	}
	require.NoError(t, p.Wait())
	wins := 0
	for _, c := range created {
		if c {
			wins++
		}
	}
	require.Equal(t, 1, wins)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tasks`))
	require.Equal(t, 1, b.count(t, `SELECT running FROM tenant_running`))
}

func TestStartWithoutIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := Start(b.ctx, b.db, StartParams{Tenant: "acme", Req: api.StartRequest{Name: "echo", Queue: "q"}})
	require.Error(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM runs`))
}

func TestRequestHashIgnoresIDAndJSONLayout(t *testing.T) {
	t.Parallel()
	a := api.StartRequest{ID: "x", Name: "n", Queue: "q", Input: json.RawMessage(`{"a":1,"b":2}`)}
	b := api.StartRequest{ID: "y", Name: "n", Queue: "q", Input: json.RawMessage(`{"b":2, "a":1}`)}
	ha, err := RequestHash(&a)
	require.NoError(t, err)
	hb, err := RequestHash(&b)
	require.NoError(t, err)
	require.Equal(t, ha, hb)
	for i, edit := range []func(*api.StartRequest){
		func(r *api.StartRequest) { r.Name = "m" },
		func(r *api.StartRequest) { r.Priority = 1 },
		func(r *api.StartRequest) { r.Input = json.RawMessage(`{"a":1,"b":3}`) },
	} {
		c := a
		edit(&c)
		hc, err := RequestHash(&c)
		require.NoError(t, err)
		require.NotEqual(t, ha, hc, fmt.Sprint("edit ", i))
	}
	_, err = RequestHash(&api.StartRequest{Input: json.RawMessage(`{`)})
	require.True(t, err != nil && !errors.Is(err, ErrConflict))
}
