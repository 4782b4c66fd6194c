package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/config"
)

// mainOut runs Main without touching the environment.
func mainOut(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// Asked-for help goes to stdout with exit 0, so that `harvest --help | less`
// works; a mistake goes to stderr with exit 2.
func TestHelpGoesToStdout(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := mainOut(args...)
		require.Equal(t, 0, code, args)
		require.Contains(t, out, "usage: harvest <command>", args)
		require.Contains(t, out, "version", args)
		require.Empty(t, errOut, args)
	}
	code, out, errOut := mainOut("nope")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, errOut, `unknown command "nope"`)
}

// A subcommand's -h prints its flags on stdout with exit 0; a bad flag
// prints them on stderr with exit 2.
func TestSubcommandHelpGoesToStdout(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dev", "-h"}, {"dev", "--help"}, {"start", "--help"}, {"runs", "--help"},
		{"runs", "list", "--help"}, {"runs", "cancel", "-h"}, {"weights", "--help"},
		{"quotas", "-h"}, {"queues", "--help"}, {"queues", "-h"}, {"runs", "retry", "-h"}, {"admission", "help"}, {"demo", "--help"}, {"prune", "--help"},
	} {
		code, out, errOut := mainOut(args...)
		require.Equal(t, 0, code, args)
		require.Contains(t, out, "usage: harvest "+args[0], args)
		require.Empty(t, errOut, args)
	}
	code, out, errOut := mainOut("dev", "--no-such-flag")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "flag provided but not defined: -no-such-flag")
	require.Contains(t, errOut, "usage: harvest dev")
	require.Contains(t, errOut, "-queues")
}

// harvest version and --version print the same line on stdout.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		code, out, errOut := mainOut(arg)
		require.Equal(t, 0, code, arg)
		require.Equal(t, "harvest "+config.Version()+"\n", out, arg)
		require.Empty(t, errOut, arg)
	}
	code, _, errOut := mainOut("version", "extra")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unexpected argument "extra"`)
}

// A bad --queues is a usage error naming the flag, before anything starts.
func TestDevQueuesFlagErrors(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "a,,b", "a:0", "a:x", "a:-1", "a,a:2", ":3"} {
		code, _, errOut := mainOut("dev", "--queues", v)
		require.Equal(t, 2, code, v)
		require.Contains(t, errOut, "--queues", v)
	}
}

// --status is checked before the gateway is asked, naming the flag.
func TestRunsListBadStatus(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	err := runRuns(context.Background(), env{stdout: &out, stderr: &errb}, []string{"list", "--status", "queued,sleeping"})
	var ue usageError
	require.ErrorAs(t, err, &ue)
	require.Contains(t, err.Error(), `--status: unknown status "sleeping"`)
	code, _, errOut := mainOut("runs", "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "want get, list, cancel or retry")
}

// The progress bar goes only to a terminal: a buffer or a regular file
// gets nothing.
func TestProgressOutputOnlyToTerminal(t *testing.T) {
	t.Parallel()
	w, shown := progressOutput(&bytes.Buffer{})
	require.False(t, shown)
	require.NotNil(t, w)
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer f.Close()
	_, shown = progressOutput(f)
	require.False(t, shown)
}
