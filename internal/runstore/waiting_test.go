package runstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// waitOpts shapes a test task for the waiting tests; zero values give a
// due task of queue "q" under the default keys.
type waitOpts struct {
	ID, Key, QuotaKey string
	Priority          int
	DueAt             time.Time
}

// task enqueues a task of a new run of tenant t1 and returns the run's id.
func (b bundle) task(t *testing.T, o waitOpts) string {
	t.Helper()
	if o.ID == "" {
		o.ID = testsvc.RandomName("run-")
	}
	testfactory.Task(b.ctx, t, b.db, testfactory.TaskOpts{Run: testfactory.RunOpts{ID: o.ID}, Queue: "q",
		Key: o.Key, QuotaKey: o.QuotaKey, Priority: o.Priority, DueAt: o.DueAt})
	return o.ID
}

// worker records a live worker of queue q (fair or not), as pkg/worker's
// presence rows say.
func (b bundle) worker(t *testing.T, name string, fair bool) {
	t.Helper()
	b.exec(t, `INSERT INTO worker_presence (worker, queue, fair, seen_at, live_until)
	           VALUES ($1, 'q', $2, now(), now() + interval '1 minute')`, name, fair)
}

func (b bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Exec(b.ctx, sql, args...)
	require.NoError(t, err)
}

func (b bundle) waiting(t *testing.T, id string) *api.RunWaiting {
	t.Helper()
	w, err := Waiting(b.ctx, b.db, "t1", id)
	require.NoError(t, err)
	require.NotNil(t, w, "a queued run always has a reason")
	return w
}

func TestWaitingNotDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	id := b.task(t, waitOpts{DueAt: due})
	w := b.waiting(t, id)
	require.Equal(t, api.WaitNotDue, w.Reason)
	require.NotNil(t, w.DueAt)
	require.True(t, w.DueAt.Equal(due), "due_at %v, want %v", w.DueAt, due)
}

func TestWaitingQueuePaused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)
	b.exec(t, `INSERT INTO queue_pauses (queue, paused_by) VALUES ('q', 'ops@example')`)
	w := b.waiting(t, b.task(t, waitOpts{}))
	require.Equal(t, api.WaitQueuePaused, w.Reason)
	require.Empty(t, w.PausedBy, "the waiting object is the tenant's: it names no operator")
	require.NotNil(t, w.PausedAt)
}

func TestWaitingNoWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.task(t, waitOpts{})
	w := b.waiting(t, id)
	require.Equal(t, api.WaitNoWorker, w.Reason)
	require.Nil(t, w.LastSeenAt)

	// A worker of another queue and one whose rows went stale do not count.
	b.exec(t, `INSERT INTO worker_presence (worker, queue, live_until) VALUES ('w1', 'other', now() + interval '1 minute')`)
	b.exec(t, `INSERT INTO worker_presence (worker, queue, seen_at, live_until)
	           VALUES ('dead', 'q', now() - interval '1 hour', now() - interval '30 minutes')`)
	w = b.waiting(t, id)
	require.Equal(t, api.WaitNoWorker, w.Reason)
	require.NotNil(t, w.LastSeenAt, "the stale row says when the queue was last served")

	b.worker(t, "w2", false)
	require.Equal(t, api.WaitNext, b.waiting(t, id).Reason)
}

func TestWaitingQuotaConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)
	b.exec(t, `INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'acct-1', 1)`)
	_, running := testfactory.Task(b.ctx, t, b.db, testfactory.TaskOpts{Queue: "q", QuotaKey: "acct-1"})
	b.exec(t, `UPDATE tasks SET state = 'running', attempt = 1, lease_token = gen_random_uuid(),
	           lease_expires_at = now() + interval '1 minute' WHERE id = $1`, running)
	w := b.waiting(t, b.task(t, waitOpts{QuotaKey: "acct-1"}))
	require.Equal(t, api.WaitQuotaConcurrency, w.Reason)
	require.Equal(t, "acct-1", w.QuotaKey)
	require.Equal(t, 1, w.MaxConcurrent)
	require.Equal(t, 1, w.Running)
}

func TestWaitingQuotaRate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)
	b.exec(t, `INSERT INTO quotas (queue, quota_key, rate, burst) VALUES ('q', 'acct-2', 0.001, 5)`)
	b.exec(t, `INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at) VALUES ('q', 'acct-2', 0.25, now())`)
	w := b.waiting(t, b.task(t, waitOpts{QuotaKey: "acct-2"}))
	require.Equal(t, api.WaitQuotaRate, w.Reason)
	require.Equal(t, "acct-2", w.QuotaKey)
	require.InDelta(t, 0.001, w.Rate, 1e-12)
	require.InDelta(t, 5, w.Burst, 1e-12)
	require.NotNil(t, w.Tokens)
	require.Less(t, *w.Tokens, 1.0)
}

func TestWaitingAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)

	// A throttled start waiting for its slot: the run is deferred, with
	// no task, until its group fires.
	testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{ID: "thr-1"})
	b.exec(t, `UPDATE runs SET status = 'deferred' WHERE tenant = 't1' AND id = 'thr-1'`)
	b.exec(t, `INSERT INTO deferred_groups (tenant, run_id, mode, queue, key, fires_at, throttle_limit, period_us,
	                                        request, opened_at)
	           VALUES ('t1', 'thr-1', 'throttle', 'q', 'acct-42', now() + interval '1 minute', 10, 60000000, '\x00', now())`)
	w := b.waiting(t, "thr-1")
	require.Equal(t, api.WaitAdmission, w.Reason)
	require.Equal(t, api.ModeThrottle, w.DeferMode)
	require.NotNil(t, w.DeferKey)
	require.Equal(t, "acct-42", *w.DeferKey)
	require.NotNil(t, w.FiresAt)

	// A queued run without a task to claim.
	testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{ID: "bare"})
	w = b.waiting(t, "bare")
	require.Equal(t, api.WaitAdmission, w.Reason)
	require.NotEmpty(t, w.Held)
}

// The fair order on a small known backlog at clock V = 10: key a is two
// claims in debt (pass 12) and the run is its third task (two of a's are
// ahead of it), so its claim starts at S = 12 + 2 = 14. Key b (pass 9,
// pulled up to 10) has 5 tasks and 4 claims before 14; key c (no state:
// it starts at 10) has 2, both before 14; key d (pass 20) has none
// before. Ahead: 2 + 4 + 2 claims of 2 other keys.
func TestWaitingFairOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", true)
	b.exec(t, `INSERT INTO fair_queues (queue, clock) VALUES ('q', 10)`)
	b.exec(t, `INSERT INTO fair_state (queue, key, pass, last_start, charged_at)
	           VALUES ('q', 'acme/a', 12, 10, now()), ('q', 'acme/b', 9, 8, now()), ('q', 'acme/d', 20, 10, now())
	           ON CONFLICT (queue, key) DO UPDATE SET pass = EXCLUDED.pass, last_start = EXCLUDED.last_start,
	                                                  charged_at = EXCLUDED.charged_at`)
	b.task(t, waitOpts{Key: "acme/a"})
	b.task(t, waitOpts{Key: "acme/a"})
	id := b.task(t, waitOpts{Key: "acme/a"})
	b.task(t, waitOpts{Key: "acme/a"}) // behind it in its own key
	for range 5 {
		b.task(t, waitOpts{Key: "acme/b"})
	}
	for range 2 {
		b.task(t, waitOpts{Key: "acme/c"})
	}
	for range 3 {
		b.task(t, waitOpts{Key: "acme/d"})
	}
	w := b.waiting(t, id)
	require.Equal(t, api.WaitFairOrder, w.Reason)
	require.NotNil(t, w.FairnessKey)
	require.Equal(t, "acme/a", *w.FairnessKey)
	require.Equal(t, 2, w.KeysAhead)
	require.Equal(t, 8, w.ClaimsAhead)
	require.False(t, w.AtLeast)

	// A higher-priority task of d puts d and that task ahead too.
	b.task(t, waitOpts{Key: "acme/d", Priority: 5})
	w = b.waiting(t, id)
	require.Equal(t, 3, w.KeysAhead)
	require.Equal(t, 9, w.ClaimsAhead)

	// The head of c's line in a fair queue with nothing before it is next.
	c := setup(t)
	c.worker(t, "w1", true)
	require.Equal(t, api.WaitNext, c.waiting(t, c.task(t, waitOpts{Key: "acme/c"})).Reason)
}

func TestWaitingQueueOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", false)
	first := b.task(t, waitOpts{Key: "x"})
	b.task(t, waitOpts{Key: "y"})
	id := b.task(t, waitOpts{Key: "x"})
	require.Equal(t, api.WaitNext, b.waiting(t, first).Reason)
	w := b.waiting(t, id)
	require.Equal(t, api.WaitQueueOrder, w.Reason)
	require.Equal(t, 2, w.ClaimsAhead)
}

func TestWaitingOnlyForWaitingRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.task(t, waitOpts{})
	b.exec(t, `UPDATE runs SET status = 'running' WHERE tenant = 't1' AND id = $1`, id)
	w, err := Waiting(b.ctx, b.db, "t1", id)
	require.NoError(t, err)
	require.Nil(t, w)
	_, err = Waiting(b.ctx, b.db, "t1", "missing")
	require.ErrorIs(t, err, ErrNotFound)
}
