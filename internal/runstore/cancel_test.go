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
