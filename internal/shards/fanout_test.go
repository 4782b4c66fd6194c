package shards

import (
	"context"
	"encoding/json"
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

// The unavailable_shards list names the shards that failed in the order
// they were asked, and is [] (not null) in JSON when every shard answered;
// Answered keeps the others.
func TestUnavailableListsTheFailedShards(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	answers := []Answer[string]{{Shard: 3, Value: "a"}, {Shard: 1, Err: boom}, {Shard: 0, Err: boom}, {Shard: 2, Value: "b"}}
	require.Equal(t, []int{1, 0}, Unavailable(answers))
	require.Equal(t, []Answer[string]{{Shard: 3, Value: "a"}, {Shard: 2, Value: "b"}}, Answered(answers))

	all := []Answer[string]{{Shard: 0, Value: "a"}}
	body, err := json.Marshal(struct {
		UnavailableShards []int `json:"unavailable_shards"`
	}{Unavailable(all)})
	require.NoError(t, err)
	require.JSONEq(t, `{"unavailable_shards": []}`, string(body))
	require.Empty(t, Unavailable[string](nil))
}
