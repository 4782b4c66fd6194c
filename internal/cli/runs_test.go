package cli

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// The next-page command the run table prints is pasted into a shell: a
// filter value comes back as the one word it was, whatever it holds.
func TestShellWordSurvivesTheShell(t *testing.T) {
	t.Parallel()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on PATH")
	}
	for _, v := range []string{"queued,failed", "billing/eu-1", "it's", "a b", "$HOME", "`id`", "*", "x;y", "\"q\"", "--flag"} {
		out, err := exec.Command(sh, "-c", "printf %s "+shellWord(v)).Output()
		require.NoError(t, err, v)
		require.Equal(t, v, string(out), "shellWord(%q) = %s", v, shellWord(v))
	}
	require.Equal(t, "queued,failed", shellWord("queued,failed"), "a plain value is not quoted")
}
