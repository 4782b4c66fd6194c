package gateway

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/envdoc"
)

// DefaultConfig is what harvest dev, the benchmarks and the tests build a
// gateway from; the binary reads the defaults of the struct tags. The two
// must be one set of values: a field whose tag and DefaultConfig disagree
// (or that DefaultConfig leaves out) fails here with its variable's name.
// Not parallel: it clears the environment with t.Setenv.
func TestDefaultConfigIsTheEnvironmentsDefaults(t *testing.T) {
	vars, err := envdoc.Vars(config.Prefix, &Config{})
	require.NoError(t, err)
	for _, v := range vars {
		// envconfig also reads a variable by its name without the prefix.
		for _, name := range []string{v.Name, strings.TrimPrefix(v.Name, config.Prefix+"_")} {
			t.Setenv(name, "")
			require.NoError(t, os.Unsetenv(name))
		}
	}
	var env Config
	require.NoError(t, config.Load(&env))
	def := DefaultConfig(nil, env.NATSURL)
	require.Equal(t, env, def, "DefaultConfig differs from the defaults of Config's tags")
}
