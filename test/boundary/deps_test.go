package boundary

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The product's binaries link what they run: the gateway and the worker
// link no plotting and no NATS server (the harness's and `harvest dev`'s),
// and the harvest CLI no plotting (the benchmarks live in the tools
// module).
func TestBinariesLinkNoHarness(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command runs the tests, so it is on PATH")
	for pkgs, banned := range map[string][]string{
		"../../cmd/gateway ../../cmd/worker": {"gonum.org/", "github.com/nats-io/nats-server/", module + "/tools/"},
		"../../cmd/harvest":                  {"gonum.org/", module + "/tools/"},
	} {
		out, err := exec.Command(gobin, append([]string{"list", "-deps"}, strings.Fields(pkgs)...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				require.False(t, strings.HasPrefix(dep, b), "%s link %s", pkgs, dep)
			}
		}
	}
}
