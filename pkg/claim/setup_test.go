package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/internal/testfactory"
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

// conn holds one connection of the bundle's pool for the rest of the test:
// for tests of what a connection keeps between statements (its plans).
func (b *bundle) conn() *pgxpool.Conn {
	b.t.Helper()
	c, err := b.db.Acquire(b.ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(c.Release)
	return c
}

// runOpts describes a run made by the factory.
type runOpts struct {
	Tenant      string // default "t1"
	Queue       string // default "q"
	MaxAttempts int    // default 3
}

func (b *bundle) run(o runOpts) int64 {
	b.t.Helper()
	return testfactory.Run(b.ctx, b.t, b.db, testfactory.RunOpts{Tenant: o.Tenant, Queue: o.Queue, MaxAttempts: o.MaxAttempts})
}

// taskOpts describes a task made by the factory; zero values are defaults
// (a new run, queue "q", the default key, priority 0, due now).
type taskOpts = testfactory.TaskOpts

func (b *bundle) task(o taskOpts) int64 {
	b.t.Helper()
	_, id := testfactory.Task(b.ctx, b.t, b.db, o)
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
		FROM tasks t JOIN runs_seen r ON r.pk = t.run_pk WHERE t.id = $1`, id).
		Scan(&r.State, &r.Attempt, &r.Token, &r.Expires, &r.DueAt, &r.Sticky, &r.RunState)
	require.NoError(b.t, err)
	return r
}

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Exec(b.ctx, sql, args...)
	require.NoError(b.t, err)
}

// drawQuota draws a quota for quota key qk of queue "q" and writes the same
// on each twin database: none (an unlimited key), a concurrency cap, a
// token bucket, or both, with caps and bursts from 1 to most. none is how
// many extra draws of the kind also mean no quota, so a test can make
// unlimited keys more common.
func drawQuota(rt *rapid.T, twins []*bundle, qk string, most, none int) {
	var capArg, rate, burst any
	switch kind := rapid.IntRange(0, 3+none).Draw(rt, "quota kind"); {
	case kind == 1:
		capArg = rapid.IntRange(1, most).Draw(rt, "cap")
	case kind == 2:
		rate, burst = 0.5, float64(rapid.IntRange(1, most).Draw(rt, "burst"))
	case kind == 3:
		capArg = rapid.IntRange(1, most).Draw(rt, "cap")
		rate, burst = 1.0, float64(rapid.IntRange(1, most).Draw(rt, "burst"))
	default:
		return
	}
	for _, b := range twins {
		b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES ('q', $1, $2, $3, $4)`,
			qk, capArg, rate, burst)
	}
}
