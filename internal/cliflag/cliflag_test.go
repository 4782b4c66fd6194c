package cliflag

import (
	"bytes"
	"errors"
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

// A bad flag or a stray argument is a UsageError; -h is flag.ErrHelp and
// prints the usage line with the program's name.
func TestParseTurnsMistakesIntoUsageErrors(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	fs := New(&out, "harvest-bench", "fleet", "fleet [-pairs 3]")
	fs.Int("pairs", 3, "rounds")
	var ue UsageError
	require.True(t, errors.As(Parse(fs, []string{"-bogus"}), &ue))
	require.Contains(t, ue.Msg, "bogus")
	require.True(t, errors.As(Parse(New(&out, "p", "n", "n"), []string{"stray"}), &ue))
	require.Equal(t, `unexpected argument "stray"`, ue.Msg)
	out.Reset()
	require.ErrorIs(t, Parse(New(&out, "harvest-bench", "fleet", "fleet [-pairs 3]"), []string{"-h"}), flag.ErrHelp)
	require.Contains(t, out.String(), "usage: harvest-bench fleet [-pairs 3]")
	require.NoError(t, Parse(fs, []string{"-pairs", "1"}))
}
