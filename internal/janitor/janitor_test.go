package janitor_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

type bundle struct {
	t   testing.TB
	ctx context.Context
	db  *pgxpool.Pool
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &bundle{t: t, ctx: ctx, db: testsvc.NewDB(t)}
}

// taskOpts describes a run with one task, made by the factory.
type taskOpts struct {
	Tenant      string // default "acme"
	MaxAttempts int    // default 3
}

// task makes a run and its first task and counts the run for its tenant,
// as a start does; it returns the run's pk and the task's id.
func (b *bundle) task(o taskOpts) (int64, int64) {
	b.t.Helper()
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	return testfactory.Task(b.ctx, b.t, b.db, testfactory.TaskOpts{Run: testfactory.RunOpts{Tenant: o.Tenant, MaxAttempts: o.MaxAttempts}})
}

func (b *bundle) scalar(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

func TestRescuesExpiredLeasesByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, live := b.task(taskOpts{})
	_, lost := b.task(taskOpts{})
	_, last := b.task(taskOpts{MaxAttempts: 1})
	_, beaten := b.task(taskOpts{})
	var leases []claim.Lease
	for range 4 {
		res, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "q", Worker: "w", Lease: time.Hour})
		require.NoError(t, err)
		require.True(t, res.OK)
		leases = append(leases, claim.Lease{ID: res.Task.ID, Token: res.Task.LeaseToken})
	}
	_, err := b.db.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1)`, []int64{lost, last, beaten})
	require.NoError(t, err)
	// A lease that ran out and was then extended by a worker's heartbeat
	// is live again: the rescue leaves it alone.
	beats, err := claim.Heartbeats(b.ctx, b.db, leases[3:], time.Hour)
	require.NoError(t, err)
	require.Equal(t, []claim.Beat{claim.BeatOK}, beats)
	require.Equal(t, beaten, leases[3].ID)

	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Requeued)
	require.Equal(t, 1, rep.FailedRuns)
	require.True(t, rep.Exclusive)
	require.Equal(t, "running", b.state(live))
	require.Equal(t, "running", b.state(beaten))
	require.Equal(t, "pending", b.state(lost))
	require.Equal(t, "done", b.state(last))
	require.Equal(t, 3, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'acme'`))
}

func (b *bundle) state(id int64) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.db.QueryRow(b.ctx, `SELECT state FROM tasks WHERE id = $1`, id).Scan(&s))
	return s
}

func TestPromotesDueTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pk, _ := b.task(taskOpts{})
	_, err := claim.Enqueue(b.ctx, b.db, claim.NewTask{RunPK: pk, Queue: "q", DueAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET due_at = now() - interval '1 second' WHERE state = 'scheduled'`)
	require.NoError(t, err)
	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Promoted)
	require.Zero(t, b.scalar(`SELECT count(*) FROM tasks WHERE state = 'scheduled'`))
}

func TestRecountHealsRunningCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(taskOpts{Tenant: "a"})
	b.task(taskOpts{Tenant: "a"})
	b.task(taskOpts{Tenant: "b"})
	// A crash of some earlier release left the counts wrong.
	_, err := b.db.Exec(b.ctx, `UPDATE tenant_running SET running = CASE tenant WHEN 'a' THEN 7 ELSE 0 END`)
	require.NoError(t, err)
	every := janitor.DefaultSettings()
	every.RecountInterval = 0 // every tick: the test ticks twice in a row
	rep, err := janitor.Tick(b.ctx, b.db, every)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Recounted)
	require.Equal(t, 2, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'a'`))
	require.Equal(t, 1, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'b'`))

	rep, err = janitor.Tick(b.ctx, b.db, every)
	require.NoError(t, err)
	require.Zero(t, rep.Recounted, "right counts are left alone")
}

// The recount reads every unfinished run of the shard, so at the defaults
// one janitor of the shard makes it once per RecountInterval, not on every
// tick; a count that drifts in between is healed at the next one due.
func TestRecountRunsOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(taskOpts{Tenant: "a"})
	drift := func() {
		t.Helper()
		_, err := b.db.Exec(b.ctx, `UPDATE tenant_running SET running = 5 WHERE tenant = 'a'`)
		require.NoError(t, err)
	}
	drift()
	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.True(t, rep.Exclusive)
	require.Equal(t, 1, rep.Recounted, "the shard's first tick recounts")
	require.Equal(t, 1, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'a'`))

	drift()
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.True(t, rep.Exclusive)
	require.Zero(t, rep.Recounted, "within the interval the recount waits")
	require.Equal(t, 5, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'a'`))

	// The interval has passed (the last recount's time moved back by it).
	_, err = b.db.Exec(b.ctx, `UPDATE settings SET value = to_jsonb(now() - $1::bigint * interval '1 microsecond')
		WHERE name = 'janitor.recounted_at'`, janitor.DefaultRecountInterval.Microseconds())
	require.NoError(t, err)
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Recounted, "the next recount due heals the count")
	require.Equal(t, 1, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'a'`))
}

func TestDeletesFinishedRunsPastRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old, _ := b.task(taskOpts{})
	recent, _ := b.task(taskOpts{})
	open, _ := b.task(taskOpts{})
	_, err := b.db.Exec(b.ctx, `SELECT harvest_run_finish(pk, 'completed', NULL, NULL) FROM runs WHERE pk = ANY($1)`, []int64{old, recent})
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET state = 'done' WHERE run_pk = ANY($1)`, []int64{old, recent})
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE runs SET finished_at = now() - interval '8 days' WHERE pk = $1`, old)
	require.NoError(t, err)

	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.DeletedRuns)
	require.Zero(t, b.scalar(`SELECT count(*) FROM runs WHERE pk = $1`, old))
	require.Zero(t, b.scalar(`SELECT count(*) FROM tasks WHERE run_pk = $1`, old), "tasks go with their run")
	require.Equal(t, 2, b.scalar(`SELECT count(*) FROM runs WHERE pk = ANY($1)`, []int64{recent, open}))
}

func TestBucketGCGatesTheFairnessPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Two keys charged long ago, an idle bucket that has refilled and one
	// whose quota is gone.
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt) VALUES
			('q', 'idle', 1, 0, now() - interval '2 hours', false),
			('q', 'clock', 6, 5, now() - interval '2 hours', true);
		INSERT INTO quotas (queue, quota_key, rate, burst) VALUES ('q', 'qk', 1, 5);
		INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at) VALUES
			('q', 'qk', 0, now() - interval '2 hours'),
			('q', 'gone', 0, now() - interval '2 hours');`)
	require.NoError(t, err)

	off := janitor.DefaultSettings()
	off.BucketGC = false
	rep, err := janitor.Tick(b.ctx, b.db, off)
	require.NoError(t, err)
	require.Zero(t, rep.PrunedKeys)
	require.Zero(t, rep.DeletedBuckets)
	require.Equal(t, 2, b.scalar(`SELECT count(*) FROM fair_state`))

	on := janitor.DefaultSettings()
	on.FairPruneInterval = 0 // every tick: the test ticks twice in a row
	on.BucketIdleWindow = 3 * time.Hour
	rep, err = janitor.Tick(b.ctx, b.db, on)
	require.NoError(t, err)
	require.Zero(t, rep.PrunedKeys, "inside the idle window nothing is idle")
	require.Zero(t, rep.DeletedBuckets)

	on.BucketIdleWindow = time.Hour
	rep, err = janitor.Tick(b.ctx, b.db, on)
	require.NoError(t, err)
	// The queue has no pending task and no recent charge: an idle queue
	// loses all its state, the clock row included.
	require.Equal(t, 2, rep.PrunedKeys)
	require.Equal(t, 2, rep.DeletedBuckets)
	require.Zero(t, b.scalar(`SELECT count(*) FROM fair_state`))

	// At the default interval the prune runs once a minute on the shard,
	// whichever janitor ticks: the first tick prunes, the next does not.
	idle := `INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt)
		VALUES ('q', 'idle', 1, 0, now() - interval '2 hours', false)`
	_, err = b.db.Exec(b.ctx, idle)
	require.NoError(t, err)
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.PrunedKeys)
	_, err = b.db.Exec(b.ctx, idle)
	require.NoError(t, err)
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Zero(t, rep.PrunedKeys, "not due again within the interval")
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM fair_state`))
}

func TestOnlyOneJanitorDoesTheExclusiveJobsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	var got bool
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_try_advisory_xact_lock(hashtext('harvest.janitor'))`).Scan(&got))
	require.True(t, got)

	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.False(t, rep.Exclusive)
}

// A key whose fairness head was lost (here wiped by hand, as a bulk load
// past the triggers or a stray edit would leave it) gets no fair claim
// while another key has work; the janitor's repair rebuilds its head from
// the task rows and the key is served again, in turn with the other.
func TestRepairServesAKeyWhoseHeadWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 20 {
		for _, key := range []string{"a", "b"} {
			pk, _ := b.task(taskOpts{})
			_, err := claim.Enqueue(b.ctx, b.db, claim.NewTask{RunPK: pk, Queue: "fq", Key: key})
			require.NoError(t, err)
		}
	}
	req := claim.Request{Queue: "fq", Worker: "w", Fair: true, Lease: time.Hour}
	keys := func(n int) []string {
		var out []string
		for range n {
			r, err := claim.Claim(b.ctx, b.db, req)
			require.NoError(t, err)
			require.True(t, r.OK)
			out = append(out, r.Task.Key)
		}
		return out
	}
	require.ElementsMatch(t, []string{"a", "b"}, keys(2))
	_, err := b.db.Exec(b.ctx, `UPDATE fair_state SET head_id = NULL, head_prio = NULL, head_cont = NULL, head_due = NULL
		WHERE queue = 'fq' AND key = 'b'`)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "a", "a", "a"}, keys(4), "the key without a head is not served")

	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.True(t, rep.Exclusive)
	require.Equal(t, 1, rep.RepairedKeys)
	// b comes back as a key that was idle: first in line, then in turn
	// with a, and no credit for the claims it missed (at most one claim
	// ahead of a at any point, ties going to the older row).
	next := keys(6)
	require.Equal(t, "b", next[0])
	for i := range next {
		nb := strings.Count(strings.Join(next[:i+1], ""), "b")
		require.LessOrEqual(t, nb-(i+1-nb), 2, "keys take turns: %v", next)
	}
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Zero(t, rep.RepairedKeys, "the repair waits for its interval")
}

// The loop ticks on its own, and a test waits on its signal for the tick
// that did the work, with no sleep: a lease that expires while the loop
// runs is rescued by one of its ticks.
func TestLoopSignalsItsTicks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, id := b.task(taskOpts{})
	res, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "q", Worker: "w", Lease: time.Hour})
	require.NoError(t, err)
	require.True(t, res.OK)

	loop := &janitor.Loop{DB: b.db, Settings: janitor.DefaultSettings(), Interval: 10 * time.Millisecond}
	loop.TestSignals.Ticked.Init()
	ctx, stop := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })

	_, err = loop.TestSignals.Ticked.WaitFor(b.ctx, func(tk janitor.Ticked) bool { return tk.Err == nil })
	require.NoError(t, err, "the loop ticks")
	require.Equal(t, "running", b.state(id), "a live lease is left alone")

	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
	tk, err := loop.TestSignals.Ticked.WaitFor(b.ctx, func(tk janitor.Ticked) bool { return tk.Requeued > 0 })
	require.NoError(t, err, "a tick rescues the expired lease")
	require.NoError(t, tk.Err)
	require.Equal(t, 1, tk.Requeued)
	require.Equal(t, "pending", b.state(id))
}

// Audit rows older than the audit retention are deleted oldest first, at
// most DefaultAuditDeleteBatch in a tick, so a backlog goes over several
// short statements; younger rows stay, and a retention of 0 keeps them
// all.
func TestDeletesAuditRowsPastTheirRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := janitor.DefaultAuditDeleteBatch + 3
	// Old rows, numbered from the youngest (1) to the oldest, one second
	// apart, past the default retention of 90 days; one row inside it and
	// one written now.
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO audit (at, actor, action, outcome, message)
		SELECT now() - interval '91 days' - g * interval '1 second', 'ops', 'old', 'ok', g::text
		FROM generate_series(1, $1::int) g`, old)
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `INSERT INTO audit (at, actor, action, outcome) VALUES
		(now() - interval '89 days', 'ops', 'recent', 'ok'), (now(), 'ops', 'new', 'ok')`)
	require.NoError(t, err)

	keep := janitor.DefaultSettings()
	keep.AuditRetention = 0
	rep, err := janitor.Tick(b.ctx, b.db, keep)
	require.NoError(t, err)
	require.True(t, rep.Exclusive)
	require.Zero(t, rep.DeletedAudit, "a retention of 0 keeps every row")
	require.Equal(t, old+2, b.scalar(`SELECT count(*) FROM audit`))

	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, janitor.DefaultAuditDeleteBatch, rep.DeletedAudit, "one batch per tick")
	var left []string
	require.NoError(t, b.db.QueryRow(b.ctx,
		`SELECT array_agg(message ORDER BY message) FROM audit WHERE action = 'old'`).Scan(&left))
	require.Equal(t, []string{"1", "2", "3"}, left, "the oldest rows go first")

	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 3, rep.DeletedAudit)
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Zero(t, rep.DeletedAudit)
	var actions []string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT array_agg(action ORDER BY action) FROM audit`).Scan(&actions))
	require.Equal(t, []string{"new", "recent"}, actions, "rows inside the retention stay")
}

// The audit delete reads the table through the audit_at index: on a shard
// with years of rows a batch must not scan the whole table to find the
// oldest.
func TestAuditDeleteCanUseTheAtIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stmt, err := os.ReadFile("sql/AuditDeleteExpired.sql")
	require.NoError(t, err)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // nothing to keep
	// The table is empty here, where a sequential scan is cheapest: forbid
	// it to see which index the planner would take on a long table.
	_, err = tx.Exec(b.ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(b.ctx, "EXPLAIN "+string(stmt), janitor.DefaultAuditRetention.Microseconds(), janitor.DefaultAuditDeleteBatch)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "audit_at", "plan:\n%s", strings.Join(plan, "\n"))
}

// Keeping audit rows for ever is allowed, but said: a janitor started with
// an audit retention of 0 logs a warning, one with a retention does not.
func TestLoopWarnsWhenAuditRowsAreKeptForEver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := func(s janitor.Settings) string {
		var buf bytes.Buffer
		loop := &janitor.Loop{DB: b.db, Settings: s, Interval: time.Hour,
			Log: slog.New(slog.NewTextHandler(&buf, nil))}
		loop.TestSignals.Ticked.Init()
		ctx, stop := context.WithCancel(b.ctx)
		done := make(chan struct{})
		go func() { defer close(done); loop.Run(ctx) }()
		_, err := loop.TestSignals.Ticked.WaitFor(b.ctx, func(janitor.Ticked) bool { return true })
		stop()
		<-done
		require.NoError(t, err)
		return buf.String()
	}
	keep := janitor.DefaultSettings()
	keep.AuditRetention = 0
	require.Contains(t, logs(keep), "level=WARN msg=\"janitor keeps audit rows for ever")
	require.NotContains(t, logs(janitor.DefaultSettings()), "audit")
}
