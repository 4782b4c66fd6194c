package shards

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each answers in the order it was given, with each shard's own number and
// error, and a shard that hangs is cut off at the timeout without holding
// the others' answers past it.
func TestEachAnswersInOrderWithinTheTimeout(t *testing.T) {
	t.Parallel()
	dbs := []string{"a", "hang", "c", "fail"}
	boom := errors.New("boom")
	got := Each(context.Background(), dbs, func(i int, _ string) int { return 10 + i }, 50*time.Millisecond,
		func(ctx context.Context, shard int, db string) (string, error) {
			switch db {
			case "hang":
				<-ctx.Done()
				return "", ctx.Err()
			case "fail":
				return "", boom
			}
			return db, nil
		})
	require.Len(t, got, 4)
	for i, a := range got {
		require.Equal(t, 10+i, a.Shard)
	}
	require.Equal(t, "a", got[0].Value)
	require.ErrorIs(t, got[1].Err, context.DeadlineExceeded)
	require.Equal(t, "c", got[2].Value)
	require.ErrorIs(t, got[3].Err, boom)

	plain := Each(context.Background(), []int{7, 8}, nil, 0, func(_ context.Context, shard, db int) (int, error) {
		return shard * db, nil
	})
	require.Equal(t, []Answer[int]{{Shard: 0, Value: 0}, {Shard: 1, Value: 8}}, plain)
}
