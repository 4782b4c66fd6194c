package boundary

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
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
	root := repoRoot(t)
	for pkgs, banned := range map[string][]string{
		"./cmd/gateway ./cmd/worker": {"gonum.org/", "github.com/nats-io/nats-server/", module + "/tools/"},
		"./cmd/harvest":              {"gonum.org/", module + "/tools/"},
	} {
		cmd := exec.Command(gobin, append([]string{"list", "-deps"}, strings.Fields(pkgs)...)...)
		cmd.Dir = root // the binaries are built in the main module
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				require.False(t, strings.HasPrefix(dep, b), "%s link %s", pkgs, dep)
			}
		}
	}
}

// testOnlyModules are the modules that only tests in tools/test (and the
// tools themselves) need: a browser driver, compose-go, the type checker's
// loader, plotting.
var testOnlyModules = []string{"github.com/chromedp/", "github.com/compose-spec/", "golang.org/x/tools", "gonum.org/"}

// testOnlyRequires lists the requirements of the go.mod file at path that
// name a module of testOnlyModules.
func testOnlyRequires(t *testing.T, path string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command runs the tests, so it is on PATH")
	out, err := exec.Command(gobin, "mod", "edit", "-json", path).Output()
	require.NoError(t, err, "go mod edit -json %s", path)
	var mod struct{ Require []struct{ Path string } }
	require.NoError(t, json.Unmarshal(out, &mod))
	require.NotEmpty(t, mod.Require, "%s requires modules", path)
	var found []string
	for _, r := range mod.Require {
		for _, m := range testOnlyModules {
			if strings.HasPrefix(r.Path, m) {
				found = append(found, r.Path)
			}
		}
	}
	return found
}

// The product's go.mod requires none of the test-only modules, directly
// or indirectly: they are the tools module's, so building, vetting or
// downloading the product never fetches them.
func TestProductModuleRequiresNoTestOnlyModule(t *testing.T) {
	t.Parallel()
	gomod := filepath.Join(repoRoot(t), "go.mod") // repoRoot reads it, so the test cache sees it
	require.Empty(t, testOnlyRequires(t, gomod), "%s requires modules only tools/test needs; move the tests that import them under tools/test", gomod)
}
