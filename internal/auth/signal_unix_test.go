//go:build unix

package auth

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWatchReloadsOnSIGHUP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	requests := SignalRequests(ctx)
	w := startWatch(t, file(entry("a", "a", "acme", RunsStart)), requests)

	// SIGHUP is caught from the moment SignalRequests returns, so it
	// cannot kill the test binary.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	r := w.next(t)
	require.True(t, r.Requested)
	require.NoError(t, r.Err)
}
