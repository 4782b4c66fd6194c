package worker

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// A batch claim that comes back short marks its queue shallow for the next
// one (claim.Request.Shallow), and one that comes back full clears it.
func TestBatchClaimShortMarksTheQueueShallow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)
	cfg := DefaultConfig()
	cfg.Queues = map[string]float64{"q": 1}
	cfg.FairnessKeys = true
	w, err := New(db, cfg, Options{})
	require.NoError(t, err)
	shallow := w.shallow["q"]
	require.False(t, shallow.Load(), "a new worker expects a full queue")

	cs, err := w.claimBatchOne(ctx, "q", 4)
	require.NoError(t, err)
	require.Empty(t, cs)
	require.True(t, shallow.Load(), "after an empty claim")

	for i := range 6 {
		testfactory.Task(ctx, t, db, testfactory.TaskOpts{Key: fmt.Sprintf("k%d", i%3)})
	}
	cs, err = w.claimBatchOne(ctx, "q", 4)
	require.NoError(t, err)
	require.Len(t, cs, 4)
	require.False(t, shallow.Load(), "after a full claim")

	cs, err = w.claimBatchOne(ctx, "q", 4)
	require.NoError(t, err)
	require.Len(t, cs, 2)
	require.True(t, shallow.Load(), "after a short claim")
}
