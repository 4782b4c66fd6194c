package api_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

func TestParseStatus(t *testing.T) {
	t.Parallel()
	for _, s := range api.Statuses() {
		got, err := api.ParseStatus(string(s))
		require.NoError(t, err)
		require.Equal(t, s, got)
		require.True(t, s.Known())
	}
	_, err := api.ParseStatus("sleeping")
	require.EqualError(t, err, `unknown status "sleeping" (known: deferred, queued, running, completed, failed, cancelled)`)
	require.False(t, api.Status("").Known())
}
