package envdoc_test

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/cli"
	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
)

var update = flag.Bool("update", false, "rewrite the generated tables of docs/configuration.md")

const docPath = "../../docs/configuration.md"

// sections maps each generated section of docs/configuration.md to the
// configuration structs of its binary.
func sections() map[string][]any {
	return map[string][]any{
		"gateway": {&gateway.Config{}},
		"worker":  {&workerbin.Config{}},
		"harvest": cli.EnvSpecs(),
	}
}

// docs/configuration.md lists every variable of every binary, as the
// binaries read them: its tables are generated from the configuration
// structs. Run `go test ./internal/envdoc -update` after changing one.
func TestConfigurationDocListsEveryVariable(t *testing.T) {
	b, err := os.ReadFile(docPath)
	require.NoError(t, err)
	doc := string(b)
	for name, specs := range sections() {
		vars, err := envdoc.Vars("HARVEST", specs...)
		require.NoError(t, err)
		re := regexp.MustCompile(`(?s)(<!-- BEGIN GENERATED ` + name + ` -->\n)(.*?)(<!-- END GENERATED ` + name + ` -->)`)
		m := re.FindStringSubmatch(doc)
		require.NotNil(t, m, "docs/configuration.md has no generated section for %s", name)
		want := envdoc.Markdown(vars)
		if *update {
			doc = re.ReplaceAllLiteralString(doc, m[1]+want+m[3])
			continue
		}
		require.Equal(t, want, m[2], "the %s table of docs/configuration.md is stale: run go test ./internal/envdoc -update", name)
		for _, v := range vars {
			require.Contains(t, m[2], "`"+v.Name+"`")
		}
	}
	if *update {
		require.NoError(t, os.WriteFile(docPath, []byte(doc), 0o644))
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
