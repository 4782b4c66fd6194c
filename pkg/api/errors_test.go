package api_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// The header's whole seconds never ask for less than the body's wait.
func TestRetryAfterSecondsRoundsUp(t *testing.T) {
	t.Parallel()
	for ms, want := range map[int64]int64{0: 0, -5: 0, 1: 1, 999: 1, 1000: 1, 1001: 2, 2500: 3} {
		e := api.NewError(api.CodeOverLimit, "x")
		e.RetryAfterMS = ms
		require.Equal(t, want, e.RetryAfterSeconds(), "%d ms", ms)
	}
}
