package faults

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// Regression: a start that lands on a pooled connection the network has
// cut gets pgx's "conn closed" error, which must count as an unreachable
// shard (503), not an internal error (500). Found by
// TestFlakyPostgresConnections and TestWeightWritesWithShardUnreachable.
func TestClosedConnectionIsUnavailable(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testsvc.NewDBURL(t))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	_, err = conn.Begin(ctx)
	require.Error(t, err)
	require.True(t, dberr.Unavailable(err), "error %q is not classed as unavailable, so it becomes a 500", err)
}

// Regression: the janitor's exclusive tick once locked every tenant's
// running-count row (for its recount) and kept those locks while it
// deleted finished runs and pruned fairness state, so every start and every
// completion on the shard waited until the tick committed. The soak saw harvest_fair_prune take
// 0.2-1.3 s on a shard of ~20k tasks, with dozens of harvest_complete calls
// and start transactions queued behind it (pg_stat_activity: Lock:tuple on
// tenant_running). Here the prune is held on a row lock, deterministically,
// and the test checks whether a tenant's count can be taken meanwhile.
func TestJanitorPruneDoesNotHoldRunningCounts(t *testing.T) {
	ctx := context.Background()
	db := testsvc.NewDB(t)
	_, err := db.Exec(ctx, `INSERT INTO tenant_running (tenant, running) VALUES ('acme', 0)`)
	require.NoError(t, err)
	// An idle queue: its fairness rows are due for pruning.
	_, err = db.Exec(ctx, `INSERT INTO fair_state (queue, key, pass, last_start, charged_at)
		VALUES ('q', 'clock', 6, 5, now() - interval '2 hours'), ('q', 'old', 2, 1, now() - interval '2 hours')`)
	require.NoError(t, err)
	blocker, err := db.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `SELECT 1 FROM fair_state WHERE key = 'old' FOR UPDATE`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := janitor.Tick(ctx, db, janitor.Settings{Retention: 168 * time.Hour, BucketGC: true, BucketIdleWindow: time.Hour})
		done <- err
	}()
	// Wait until the tick is inside the prune, waiting on the row.
	require.Eventually(t, func() bool {
		var n int
		_ = db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query ILIKE '%fair_prune%'`).Scan(&n)
		return n > 0
	}, time.Minute, 20*time.Millisecond)
	_, lockErr := db.Exec(ctx, `SELECT 1 FROM tenant_running WHERE tenant = 'acme' FOR UPDATE NOWAIT`)
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-done)
	require.NoError(t, lockErr, "a start or completion would wait for the janitor's prune")
}
