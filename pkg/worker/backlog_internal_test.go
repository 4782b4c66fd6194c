package worker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// The dispatch's backlog check (QueueBacklog: is another due task
// pending in the queue?) reads a row or two of the pending index, never
// the table, on the planner's worst case (drainedShard). It answers right
// both ways: another task waits, or the dispatched one is the queue's only
// due work.
func TestQueueBacklogReadsNoHistory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	pages := drainedShard(ctx, t, db, 2)
	var first, last int64
	require.NoError(t, db.QueryRow(ctx, `SELECT min(id), max(id) FROM tasks WHERE state = 'pending'`).Scan(&first, &last))

	// backlog asks for a dispatch of id and returns the answer and the
	// heap blocks of tasks the question read.
	backlog := func(id int64) (bool, int) {
		t.Helper()
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // read only
		blocks := testsvc.BlocksRead(ctx, t, tx, "tasks")
		var more bool
		require.NoError(t, tx.QueryRow(ctx, sqlQueueBacklog, "q", id).Scan(&more))
		return more, blocks()
	}
	more, read := backlog(last)
	require.True(t, more, "another task of the queue is due")
	require.Less(t, read, pages/10, "heap blocks of tasks read, of %d", pages)

	_, err := db.Exec(ctx, `UPDATE tasks SET state = 'done' WHERE id = $1`, first)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM tasks`)
	require.NoError(t, err)
	more, read = backlog(last)
	require.False(t, more, "the dispatched task is the queue's only due work")
	require.Less(t, read, pages/10, "heap blocks of tasks read, of %d", pages)
}
