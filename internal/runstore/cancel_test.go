package runstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A cancel and a start of the same tenant and key meet only on the
// tenant's count row: the start takes it first, and neither touches the
// key's fairness state (a start appends an arrival, a cancel leaves the
// key's head for the next fair claim to find stale). So a cancel waiting
// for the count while the start goes on to write its run and task cannot
// deadlock; it finishes once the start commits.
func TestCancelWaitsForStartOfSameTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.start(t, startOpts{ID: "old", Tenant: "acme"})
	require.NoError(t, err)

	// A start transaction that holds the tenant's count row, as a start
	// group does before it writes.
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
	_, err = tx.Exec(b.ctx, sqlTenantRunningLock, []string{"acme"})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := Cancel(b.ctx, b.db, "acme", "old", 1, "test")
		done <- err
	}()
	// The cancel has locked the old run's task and waits for the count.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 5*time.Millisecond)

	// The start writes its run and task without waiting for the cancel.
	_, err = StartTx(b.ctx, tx, params(t, "acme", "new"))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-done)

	old, err := Get(b.ctx, b.db, "acme", "old", 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, old.Status)
	require.Equal(t, 1, b.running(t, "acme"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tasks WHERE queue = 'shared' AND state = 'pending'`))
}

// What a cancel answers, run by run: an unknown id (or another tenant's),
// a queued run, a run cancelled already and a run that failed; and what it
// leaves behind.
func TestCancelAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started, err := b.start(t, startOpts{ID: "queued", Tenant: "acme"})
	require.NoError(t, err)
	failed := b.failRun(t, "acme")

	_, err = Cancel(b.ctx, b.db, "acme", "nothing", 1, "user")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = Cancel(b.ctx, b.db, "globex", "queued", 1, "user")
	require.ErrorIs(t, err, ErrNotFound, "another tenant's run is not found")

	res, err := Cancel(b.ctx, b.db, "acme", "queued", 1, "user")
	require.NoError(t, err)
	require.True(t, res.Cancelled)
	require.False(t, res.WasRunning)
	require.Equal(t, api.StatusCancelled, res.Run.Status)
	require.Equal(t, "queued", res.Run.ID)
	require.Equal(t, 1, res.Run.Shard)
	require.NotNil(t, res.Run.FinishedAt)
	require.Equal(t, "user", *res.Run.Error)
	require.Zero(t, res.Run.Attempts, "no attempt was in flight")
	got, err := Get(b.ctx, b.db, "acme", "queued", 1)
	require.NoError(t, err)
	require.Equal(t, res.Run, got, "the answer is the run as it reads after the cancel")
	require.Equal(t, "done", b.state(t, started.TaskID))
	require.Zero(t, b.running(t, "acme"), "the failed run and the cancelled one are both final")

	again, err := Cancel(b.ctx, b.db, "acme", "queued", 1, "again")
	require.NoError(t, err)
	require.False(t, again.Cancelled, "cancelled already")
	require.Equal(t, res.Run, again.Run, "and left as it was")

	fin, err := Cancel(b.ctx, b.db, "acme", failed, 1, "user")
	require.ErrorIs(t, err, ErrFinished)
	require.Equal(t, api.StatusFailed, fin.Run.Status)
	require.Equal(t, failed, fin.Run.ID)
}

// A run a move is copying is not cancelled on the old home: nothing of it
// changes, and the caller is told to try again (the gateway then finds it
// on the new home).
func TestCancelDuringAMove(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started, err := b.start(t, startOpts{ID: "r1", Tenant: "acme"})
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `INSERT INTO move_out (run_pk, tenant, moved_to) SELECT pk, tenant, 2 FROM runs WHERE id = 'r1'`)
	require.NoError(t, err)

	_, err = Cancel(b.ctx, b.db, "acme", "r1", 1, "user")
	require.ErrorIs(t, err, ErrRunMoving)
	run, err := Get(b.ctx, b.db, "acme", "r1", 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, run.Status, "the cancel was undone whole")
	require.Equal(t, "pending", b.state(t, started.TaskID))
	require.Equal(t, 1, b.running(t, "acme"))
}

// state is task id's state.
func (b bundle) state(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT state FROM tasks WHERE id = $1`, id).Scan(&s))
	return s
}
