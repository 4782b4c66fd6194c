package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A shard URL that names a primary and its standbys holds commas of its
// own: they stay in the URL, and the next postgres:// begins the next
// shard. Passwords stay hidden in every host of such a URL.
func TestShardsDecodeKeepsMultiHostURLsWhole(t *testing.T) {
	t.Parallel()
	var s Shards
	require.NoError(t, s.Decode("postgres://u:secret@a:5432, b:5433/db?target_session_attrs=read-write,postgresql://c/y,postgres://d,e,f/z"))
	require.Equal(t, Shards{
		"postgres://u:secret@a:5432,b:5433/db?target_session_attrs=read-write",
		"postgresql://c/y",
		"postgres://d,e,f/z",
	}, s)
	require.NoError(t, s.Validate())
	require.NotContains(t, Redact(s[0]), "secret")
	require.Contains(t, Redact(s[0]), "a:5432,b:5433")
}
