package testsignal

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSignalDoesNothingUntilInitialised(t *testing.T) {
	t.Parallel()
	var s Signal[int]
	s.Signal(1) // production: no channel, no block
	_, err := s.WaitFor(context.Background(), func(int) bool { return true })
	require.Error(t, err)

	s.Init()
	for i := range 1000 { // more than it keeps: the loop never blocks
		s.Signal(i)
	}
	v, err := s.WaitFor(context.Background(), func(v int) bool { return v == 999 })
	require.NoError(t, err)
	require.Equal(t, 999, v)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.WaitFor(ctx, func(int) bool { return true })
	require.ErrorIs(t, err, context.Canceled)
}
