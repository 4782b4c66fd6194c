package envdoc_test

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/cli"
	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
)

var update = flag.Bool("update", false, "rewrite the generated tables of docs/configuration.md and docs/worker.md")

// generatedDocs are the pages that hold generated tables, each with the
// sections it holds. docs/worker.md shows the worker's table beside the
// prose about it; both copies come from the same struct, so neither can
// drift.
var generatedDocs = map[string][]string{
	"../../docs/configuration.md": {"gateway", "worker", "harvest"},
	"../../docs/worker.md":        {"worker"},
}

// sections maps each generated section to the configuration structs of
// its binary.
func sections() map[string][]any {
	return map[string][]any{
		"gateway": {&gateway.Config{}},
		"worker":  {&workerbin.Config{}},
		"harvest": cli.EnvSpecs(),
	}
}

// The docs list every variable of every binary, as the binaries read them:
// their tables are generated from the configuration structs. Run
// `go test ./internal/envdoc -update` after changing one.
func TestConfigurationDocListsEveryVariable(t *testing.T) {
	specs := sections()
	for docPath, names := range generatedDocs {
		b, err := os.ReadFile(docPath)
		require.NoError(t, err)
		doc := string(b)
		for _, name := range names {
			vars, err := envdoc.Vars("HARVEST", specs[name]...)
			require.NoError(t, err)
			re := regexp.MustCompile(`(?s)(<!-- BEGIN GENERATED ` + name + ` -->\n)(.*?)(<!-- END GENERATED ` + name + ` -->)`)
			m := re.FindStringSubmatch(doc)
			require.NotNil(t, m, "%s has no generated section for %s", docPath, name)
			want := envdoc.Markdown(vars)
			if *update {
				doc = re.ReplaceAllLiteralString(doc, m[1]+want+m[3])
				continue
			}
			require.Equal(t, want, m[2], "the %s table of %s is stale: run go test ./internal/envdoc -update", name, docPath)
			for _, v := range vars {
				require.Contains(t, m[2], "`"+v.Name+"`")
			}
		}
		if *update {
			require.NoError(t, os.WriteFile(docPath, []byte(doc), 0o644))
		}
	}
}

// No page but the generated sections carries a table row of a variable
// with its default (a row of three cells or more):
// a hand-kept copy of a table is how docs/worker.md once drifted.
func TestNoHandKeptVariableTable(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `HARVEST_[A-Z0-9_]+` \\|[^|\\n]*\\|[^|\\n]*\\|")
	gen := regexp.MustCompile(`(?s)<!-- BEGIN GENERATED \w+ -->.*?<!-- END GENERATED \w+ -->`)
	for _, p := range docs {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		rest := gen.ReplaceAllString(string(b), "")
		require.Empty(t, row.FindAllString(rest, -1), "%s keeps a table of variables by hand: generate it (see generatedDocs)", p)
	}
}

func TestVarsOfAStruct(t *testing.T) {
	type spec struct {
		A string `envconfig:"A_ONE" default:"x" desc:"first"`
		B int    `envconfig:"B_TWO" required:"true"`
	}
	type other struct {
		B int `envconfig:"B_TWO" desc:"second"`
	}
	vars, err := envdoc.Vars("P", &spec{}, &other{})
	require.NoError(t, err)
	require.Equal(t, []envdoc.Var{
		{Name: "P_A_ONE", Type: "String", Default: "x", Desc: "first"},
		{Name: "P_B_TWO", Type: "Integer", Required: true, Desc: "second"},
	}, vars)
	require.True(t, strings.Contains(envdoc.Markdown(vars), "| `P_B_TWO` | integer | required | second |"))
}
