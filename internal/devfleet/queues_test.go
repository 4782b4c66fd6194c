package devfleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// --queues reads names with optional shares, and every mistake names the
// flag.
func TestParseQueues(t *testing.T) {
	t.Parallel()
	q, err := ParseQueues(" a , b:3")
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"a": 1, "b": 3}, q)
	require.Equal(t, "a,b:3", QueueList(q))

	for _, v := range []string{"", "a,", "b:0", "b:1.5", "b:", "a,a", ":2", "a:2000000"} {
		_, err := ParseQueues(v)
		require.ErrorContains(t, err, "--queues", v)
	}
}
