package config

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
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

type fakeCfg struct {
	Port int `envconfig:"TEST_BINARY_PORT" default:"7" desc:"a port"`
}

func (c fakeCfg) Validate() error {
	if c.Port <= 0 {
		return fmt.Errorf("HARVEST_TEST_BINARY_PORT: %d must be positive", c.Port)
	}
	return nil
}

func TestBinaryStart(t *testing.T) {
	b := Binary{Name: "tool", Intro: "tool: does things.\n"}
	var out, errb bytes.Buffer
	var cfg fakeCfg

	code, ok := b.Start([]string{"--help"}, &out, &errb, &cfg)
	require.False(t, ok)
	require.Equal(t, ExitOK, code)
	require.Contains(t, out.String(), "tool: does things.")
	require.Contains(t, out.String(), "HARVEST_TEST_BINARY_PORT")

	code, ok = b.Start([]string{"serve"}, &out, &errb, &cfg)
	require.False(t, ok)
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errb.String(), `tool: unexpected argument "serve"`)

	t.Setenv("HARVEST_TEST_BINARY_PORT", "-1")
	errb.Reset()
	code, ok = b.Start(nil, &out, &errb, &cfg)
	require.False(t, ok)
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errb.String(), "HARVEST_TEST_BINARY_PORT")

	t.Setenv("HARVEST_TEST_BINARY_PORT", "80")
	code, ok = b.Start(nil, &out, &errb, &cfg)
	require.True(t, ok)
	require.Equal(t, ExitOK, code)
	require.Equal(t, 80, cfg.Port)
}

// --version prints the binary's name and version on stdout and stops it,
// like --help; nothing goes to stderr.
func TestBinaryVersion(t *testing.T) {
	t.Parallel()
	b := Binary{Name: "tool", Intro: "tool: does things.\n"}
	for _, arg := range []string{"--version", "-version", "version"} {
		var out, errb bytes.Buffer
		var cfg fakeCfg
		code, ok := b.Start([]string{arg}, &out, &errb, &cfg)
		require.False(t, ok, arg)
		require.Equal(t, ExitOK, code, arg)
		require.Equal(t, "tool "+Version()+"\n", out.String(), arg)
		require.Empty(t, errb.String(), arg)
	}
}

// Version always names a version (a test binary has none of its own, so
// "(devel)") and the Go version.
func TestVersionNamesGo(t *testing.T) {
	t.Parallel()
	v := Version()
	require.Contains(t, v, runtime.Version())
	require.NotEmpty(t, strings.Fields(v)[0])
}
