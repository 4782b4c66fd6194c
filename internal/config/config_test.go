package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestShardsDecodeTrimsAndKeepsOrder(t *testing.T) {
	t.Parallel()
	var s Shards
	require.NoError(t, s.Decode(" postgres://a/x , postgresql://b/y"))
	require.Equal(t, Shards{"postgres://a/x", "postgresql://b/y"}, s)
	require.NoError(t, s.Validate())

	require.NoError(t, s.Decode("  "))
	require.Empty(t, s)
}

func TestShardsValidateNamesVariableAndShard(t *testing.T) {
	t.Parallel()
	err := Shards{"postgres://a/x", "mysql://u:secret@b/y"}.Validate()
	require.ErrorContains(t, err, "HARVEST_SHARDS: shard 1")
	require.NotContains(t, err.Error(), "secret", "passwords never reach error messages")

	require.ErrorContains(t, Shards{}.Validate(), "HARVEST_SHARDS: empty")
}

func TestLoadReadsPrefixedVariables(t *testing.T) {
	t.Setenv("HARVEST_SHARDS", "postgres://a/x,postgres://b/y")
	t.Setenv("HARVEST_NATS_URL", "nats://n:4222")
	var c Common
	require.NoError(t, Load(&c))
	require.Equal(t, Shards{"postgres://a/x", "postgres://b/y"}, c.Shards)
	require.Equal(t, "nats://n:4222", c.NATSURL)
	require.NoError(t, c.Validate())
}

func TestRedactHidesPassword(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:xxxxx@h/db", Redact("postgres://u:pw@h/db"))
	require.Equal(t, "postgres://u@h/db", Redact("postgres://u@h/db"))
}
