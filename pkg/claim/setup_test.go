package claim_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// bundle is what most tests need: a context, a fresh migrated database and
// factories for its rows.
type bundle struct {
	ctx context.Context
	db  *pgxpool.Pool
	t   testing.TB
}

func setup(t testing.TB) *bundle {
	t.Helper()
	// Long enough for the property tests under the race detector on a
	// loaded machine; a hang still ends with go test's own timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, db: testsvc.NewDB(t), t: t}
}

// runOpts describes a run made by the factory.
type runOpts struct {
	Tenant      string // default "t1"
	Queue       string // default "q"
	MaxAttempts int    // default 3
}

func (b *bundle) run(o runOpts) int64 {
	b.t.Helper()
	if o.Tenant == "" {
		o.Tenant = "t1"
	}
	if o.Queue == "" {
		o.Queue = "q"
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 3
	}
	var pk int64
	err := b.db.QueryRow(b.ctx, `
		WITH r AS (
			INSERT INTO runs (tenant, id, name, queue, request_hash, max_attempts)
			VALUES ($1, gen_random_uuid()::text, 'wf', $2, '\x00', $3) RETURNING pk, tenant
		), c AS (
			INSERT INTO tenant_running (tenant, running) SELECT tenant, 1 FROM r
			ON CONFLICT (tenant) DO UPDATE SET running = tenant_running.running + 1
		)
		SELECT pk FROM r`, o.Tenant, o.Queue, o.MaxAttempts).Scan(&pk)
	require.NoError(b.t, err)
	return pk
}

// taskOpts describes a task made by the factory; zero values are defaults
// (a new run, queue "q", the default key, priority 0, due now).
type taskOpts struct {
	RunPK        int64
	Queue        string
	Key          string
	QuotaKey     string
	Priority     int
	Continuation bool
	DueAt        time.Time
	StickyWorker string
	StickyUntil  time.Time
	Now          time.Time
}

func (b *bundle) task(o taskOpts) int64 {
	b.t.Helper()
	if o.Queue == "" {
		o.Queue = "q"
	}
	if o.RunPK == 0 {
		o.RunPK = b.run(runOpts{Queue: o.Queue})
	}
	id, err := claim.Enqueue(b.ctx, b.db, claim.NewTask{
		RunPK: o.RunPK, Queue: o.Queue, Key: o.Key, QuotaKey: o.QuotaKey, Priority: o.Priority,
		Continuation: o.Continuation, DueAt: o.DueAt, StickyWorker: o.StickyWorker,
		StickyUntil: o.StickyUntil, Now: o.Now, Input: json.RawMessage(`{}`),
	})
	require.NoError(b.t, err)
	return id
}

// tasks makes n tasks with the same options, in id order.
func (b *bundle) tasks(n int, o taskOpts) []int64 {
	b.t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = b.task(o)
	}
	return ids
}

func (b *bundle) claim(req claim.Request) claim.Result {
	b.t.Helper()
	res, err := claim.Claim(b.ctx, b.db, req)
	require.NoError(b.t, err)
	return res
}

// taskRow is a task's row as stored, for before/after comparisons.
type taskRow struct {
	State    string
	Attempt  int
	Token    *string
	Expires  *time.Time
	DueAt    time.Time
	Sticky   *string
	RunState string
}

func (b *bundle) row(id int64) taskRow {
	b.t.Helper()
	var r taskRow
	err := b.db.QueryRow(b.ctx, `
		SELECT t.state, t.attempt, t.lease_token::text, t.lease_expires_at, t.due_at, t.sticky_worker, r.status
		FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE t.id = $1`, id).
		Scan(&r.State, &r.Attempt, &r.Token, &r.Expires, &r.DueAt, &r.Sticky, &r.RunState)
	require.NoError(b.t, err)
	return r
}

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Exec(b.ctx, sql, args...)
	require.NoError(b.t, err)
}
