package client_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A client links neither the database driver nor the server side: what it
// reads are the wire types of pkg/api.
func TestClientLinksNoServerSide(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command runs the tests, so it is on PATH")
	out, err := exec.Command(gobin, "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		require.False(t, strings.HasPrefix(dep, "github.com/jackc/pgx"), "pkg/client links %s", dep)
		require.False(t, strings.Contains(dep, "/internal/") && strings.HasPrefix(dep, "github.com/harvest-run/"), "pkg/client links %s", dep)
		for _, server := range []string{"/pkg/weights", "/pkg/tenantcap", "/pkg/claim"} {
			require.False(t, strings.HasSuffix(dep, server), "pkg/client links %s", dep)
		}
	}
}
