package runstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A cancel and a start of the same tenant and key lock the key's summary
// row and the tenant's count row in opposite orders. When they deadlock,
// PostgreSQL breaks the cancel's transaction (it waited first, so its
// deadlock check runs first); the cancel is then tried again and succeeds
// once the start has committed, instead of failing the caller.
func TestCancelSurvivesDeadlockWithStart(t *testing.T) {
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
	// The cancel has taken the key's summary row and waits for the count.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 5*time.Millisecond)

	// The start now needs the summary row the cancel holds.
	_, err = StartTx(b.ctx, tx, params(t, "acme", "new"))
	require.NoError(t, err, "the start is not the deadlock's victim")
	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-done, "the cancel is tried again after the deadlock")

	old, err := Get(b.ctx, b.db, "acme", "old", 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, old.Status)
	require.Equal(t, 1, b.running(t, "acme"))
	require.Equal(t, 1, b.count(t, `SELECT pending FROM fair_state WHERE queue = 'shared'`))
}
