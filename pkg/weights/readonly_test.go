package weights_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/weights"
)

// A weight written through a connection to a primary that has turned
// read-only (a switchover; SQLSTATE 25006) is ErrUnavailable, like a
// shard that did not answer: nothing was written, and the same write sent
// again reaches the new primary.
func TestReadOnlyServerIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testsvc.NewDB(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET default_transaction_read_only = on")
	require.NoError(t, err)

	_, err = weights.SetOne(ctx, conn, "ops", "q", "k", 2)
	require.ErrorIs(t, err, weights.ErrUnavailable)
	list, err := weights.List(ctx, pool, "q")
	require.NoError(t, err)
	require.Empty(t, list, "nothing was written")
}
