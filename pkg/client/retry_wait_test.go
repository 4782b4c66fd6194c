package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A wait the gateway asked for is never shortened, is spread over up to
// half again so that callers refused together do not come back together,
// grows while the refusals go on, and stays within MaxDelay.
func TestRetryWaitJittersAboveRetryAfter(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for range 200 {
		w := retryWait(1, time.Second, 10*time.Second)
		require.GreaterOrEqual(t, w, time.Second, "never sooner than asked")
		require.LessOrEqual(t, w, 1500*time.Millisecond)
		seen[w] = true
	}
	require.Greater(t, len(seen), 1, "callers refused together come back spread out")
	for range 50 {
		w := retryWait(3, time.Second, 10*time.Second)
		require.GreaterOrEqual(t, w, 4*time.Second, "the third refusal in a row waits longer")
		require.LessOrEqual(t, w, 6*time.Second)
		w = retryWait(10, time.Second, 3*time.Second)
		require.GreaterOrEqual(t, w, time.Second)
		require.LessOrEqual(t, w, 3*time.Second, "within MaxDelay")
		w = retryWait(1, 3*time.Second, 3*time.Second)
		require.Equal(t, 3*time.Second, w, "a Retry-After of MaxDelay is waited as it is")
	}
	// Without a hint: the backoff from 100ms.
	w := retryWait(1, 0, time.Second)
	require.GreaterOrEqual(t, w, 50*time.Millisecond)
	require.LessOrEqual(t, w, 100*time.Millisecond)
}
