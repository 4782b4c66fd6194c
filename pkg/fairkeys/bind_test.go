package fairkeys_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

func TestBindingNamesAndOwnership(t *testing.T) {
	t.Parallel()
	require.Equal(t, "acme", fairkeys.Bound("acme", ""))
	require.Equal(t, "acme/vip", fairkeys.Bound("acme", "vip"))
	require.Equal(t, "acme/globex/vip", fairkeys.Bound("acme", "globex/vip"), "a tenant naming another's key gets a key of its own")
	for _, k := range []string{"acme", "acme/vip", "acme/a/b"} {
		require.True(t, fairkeys.BoundTo(k, "acme"), k)
	}
	for _, k := range []string{"acmex", "acmex/vip", "globex/acme", "", "acm"} {
		require.False(t, fairkeys.BoundTo(k, "acme"), k)
	}
}
