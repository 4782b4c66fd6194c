package compose

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/cli"
	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
)

// repoFile is the path of rel from the repository's root, three levels up
// from this package (tools/test/compose): the files checked are the
// product's, in the main module.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
}

type service struct {
	Image       string         `yaml:"image"`
	Build       any            `yaml:"build"`
	Command     any            `yaml:"command"`
	Entrypoint  any            `yaml:"entrypoint"`
	Restart     string         `yaml:"restart"`
	Environment any            `yaml:"environment"`
	Ports       []any          `yaml:"ports"`
	Healthcheck map[string]any `yaml:"healthcheck"`
	DependsOn   any            `yaml:"depends_on"`
}

type composeFile struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

// load reads deploy/compose.yaml through compose-go (schema validated,
// .env interpolated) into the loose form the checks below walk.
func load(t *testing.T) composeFile {
	t.Helper()
	p := loadProject(t)
	f := composeFile{Services: map[string]service{}, Volumes: map[string]any{}}
	for name, s := range p.Services {
		out := service{Image: s.Image, Restart: s.Restart,
			Command: toAny(s.Command), Entrypoint: toAny(s.Entrypoint)}
		if s.Build != nil {
			out.Build = s.Build
		}
		envm := map[string]any{}
		for k := range s.Environment {
			envm[k] = envValue(s, k)
		}
		out.Environment = envm
		for _, port := range s.Ports {
			out.Ports = append(out.Ports, fmt.Sprintf("%s:%s:%d", port.HostIP, port.Published, port.Target))
		}
		if s.HealthCheck != nil && len(s.HealthCheck.Test) > 0 {
			out.Healthcheck = map[string]any{"test": toAny(s.HealthCheck.Test)}
		}
		if len(s.DependsOn) > 0 {
			deps := map[string]any{}
			for dep, d := range s.DependsOn {
				deps[dep] = map[string]any{"condition": d.Condition}
			}
			out.DependsOn = deps
		}
		f.Services[name] = out
	}
	for name, v := range p.Volumes {
		f.Volumes[name] = v
	}
	require.NotEmpty(t, f.Services)
	return f
}

func toAny(words []string) []any {
	if len(words) == 0 {
		return nil
	}
	out := make([]any, len(words))
	for i, w := range words {
		out[i] = w
	}
	return out
}

// words turns a command or entrypoint (list or string) into its words.
func words(v any) []string {
	switch x := v.(type) {
	case string:
		return strings.Fields(x)
	case []any:
		out := make([]string, len(x))
		for i, w := range x {
			out[i] = fmt.Sprint(w)
		}
		return out
	}
	return nil
}

// env returns a service's environment in either of compose's forms.
func env(t *testing.T, name string, v any) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch x := v.(type) {
	case nil:
	case map[string]any:
		for k, val := range x {
			if val == nil {
				out[k] = ""
			} else {
				out[k] = fmt.Sprint(val)
			}
		}
	case []any:
		for _, item := range x {
			k, val, _ := strings.Cut(fmt.Sprint(item), "=")
			out[k] = val
		}
	default:
		t.Fatalf("service %s: environment is neither a mapping nor a list", name)
	}
	return out
}

// binary is the Harvest binary a service runs, "" for other images.
func binary(s service) string {
	cmd := append(words(s.Entrypoint), words(s.Command)...)
	if len(cmd) == 0 {
		return ""
	}
	switch b := filepath.Base(cmd[0]); b {
	case "gateway", "worker", "harvest":
		return b
	}
	return ""
}

func knownVars(t *testing.T) map[string]map[string]bool {
	t.Helper()
	specs := map[string][]any{
		"gateway": {&gateway.Config{}},
		"worker":  {&workerbin.Config{}},
		"harvest": cli.EnvSpecs(),
	}
	out := map[string]map[string]bool{}
	for bin, s := range specs {
		vars, err := envdoc.Vars("HARVEST", s...)
		require.NoError(t, err)
		out[bin] = envdoc.Names(vars)
		require.NotEmpty(t, out[bin])
	}
	return out
}

// dependsOn returns the long form of depends_on: service -> condition.
func dependsOn(t *testing.T, name string, v any) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch x := v.(type) {
	case nil:
	case map[string]any:
		for dep, spec := range x {
			m, _ := spec.(map[string]any)
			cond, _ := m["condition"].(string)
			out[dep] = cond
		}
	case []any:
		t.Fatalf("service %s: depends_on in the short form sets no condition; use dep: {condition: ...}", name)
	}
	return out
}

var interp = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`)

func TestComposeFile(t *testing.T) {
	f := load(t)
	known := knownVars(t)

	oneShot := func(s service) bool { return s.Restart == "no" }
	shards := -1
	workerShards := map[int]int{}
	binaries := map[string]int{}
	hostPorts := map[string]string{}

	for name, s := range f.Services {
		// Every service says what it runs.
		require.True(t, s.Image != "" || s.Build != nil, "service %s: neither image nor build", name)

		// Healthchecks on everything that keeps running.
		if !oneShot(s) {
			test := words(s.Healthcheck["test"])
			require.NotEmpty(t, test, "service %s: no healthcheck", name)
			require.Contains(t, []string{"CMD", "CMD-SHELL"}, test[0], "service %s: healthcheck test", name)
		}

		// Ports: no host port published twice.
		for _, p := range s.Ports {
			spec := fmt.Sprint(p)
			parts := strings.Split(spec, ":")
			require.GreaterOrEqual(t, len(parts), 2, "service %s: port %q publishes no fixed host port", name, spec)
			host := parts[len(parts)-2]
			if other, dup := hostPorts[host]; dup {
				t.Errorf("host port %s published by %s and %s", host, other, name)
			}
			hostPorts[host] = name
		}

		// Dependencies name real services with a condition that fits.
		for dep, cond := range dependsOn(t, name, s.DependsOn) {
			d, ok := f.Services[dep]
			require.True(t, ok, "service %s depends on unknown service %s", name, dep)
			switch cond {
			case "service_healthy":
				require.NotEmpty(t, d.Healthcheck, "service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			case "service_completed_successfully":
				require.True(t, oneShot(d), "service %s waits for %s to complete, which is not a one-shot", name, dep)
			case "service_started":
			default:
				t.Errorf("service %s: depends_on %s: condition %q (want service_healthy, service_completed_successfully or service_started)", name, dep, cond)
			}
		}

		// Harvest binaries: only variables they read.
		bin := binary(s)
		e := env(t, name, s.Environment)
		if bin == "" {
			continue
		}
		binaries[bin]++
		require.True(t, s.Image != "" || s.Build != nil)
		for k := range e {
			if strings.HasPrefix(k, "OTEL_") {
				continue
			}
			require.True(t, known[bin][k], "service %s: %s is not a variable %s reads (known: %v)", name, k, bin, sortedKeys(known[bin]))
		}
		if bin == "worker" || bin == "gateway" {
			require.NotEmpty(t, s.DependsOn, "service %s: no depends_on", name)
		}
		if v, ok := e["HARVEST_SHARDS"]; ok {
			n := len(strings.Split(v, ","))
			if shards == -1 {
				shards = n
			}
			require.Equal(t, shards, n, "service %s lists another number of shards", name)
		}
		if bin == "worker" {
			n, err := strconv.Atoi(e["HARVEST_WORKER_SHARD"])
			require.NoError(t, err, "service %s: HARVEST_WORKER_SHARD", name)
			workerShards[n]++
		}
	}
	// The fleet the issue asks for.
	require.Equal(t, 2, shards, "two shards")
	require.Equal(t, 2, binaries["gateway"], "two gateways")
	require.Equal(t, 3, binaries["worker"], "three workers")
	require.Equal(t, 1, binaries["harvest"], "one migration step")
	for i := range shards {
		require.Positive(t, workerShards[i], "no worker serves shard %d", i)
	}

	// NATS is a cluster of three nodes, each loading the same
	// configuration and given every variable it reads; the nodes route to
	// one another, and every Harvest process is given all three.
	conf, err := os.ReadFile(repoFile(t, "deploy/nats/nats.conf"))
	require.NoError(t, err)
	refs := regexp.MustCompile(`\$([A-Z_][A-Z0-9_]*)`).FindAllStringSubmatch(string(conf), -1)
	require.NotEmpty(t, refs)
	for _, name := range natsNodes {
		nats, ok := f.Services[name]
		require.True(t, ok, "no %s service", name)
		require.Contains(t, words(nats.Command), "/etc/nats/nats.conf", "service %s: the shared configuration", name)
		natsEnv := env(t, name, nats.Environment)
		for _, m := range refs {
			require.Contains(t, natsEnv, m[1], "nats.conf reads $%s, which service %s does not set", m[1], name)
		}
		routes := natsEnv["HARVEST_NATS_ROUTES"]
		for _, peer := range natsNodes {
			require.Contains(t, routes, "@"+peer+":6222", "service %s does not route to %s", name, peer)
		}
	}
	for name, s := range f.Services {
		if bin := binary(s); bin == "gateway" || bin == "worker" {
			urls := env(t, name, s.Environment)["HARVEST_NATS_URL"]
			for _, node := range natsNodes {
				require.Contains(t, urls, "@"+node+":4222", "service %s is not given NATS node %s", name, node)
			}
		}
	}

	// Every ${VAR} the file interpolates has a value in deploy/.env.
	raw, err := os.ReadFile(repoFile(t, "deploy/compose.yaml"))
	require.NoError(t, err)
	dotenv, err := os.ReadFile(repoFile(t, "deploy/.env"))
	require.NoError(t, err)
	for _, m := range interp.FindAllStringSubmatch(string(raw), -1) {
		require.Regexp(t, "(?m)^"+m[1]+"=.+", string(dotenv), "deploy/.env does not set %s", m[1])
	}

	// Named volumes are declared.
	for name := range f.Volumes {
		require.NotEmpty(t, name)
	}
}

// natsNodes are the compose services of the NATS cluster.
var natsNodes = []string{"nats1", "nats2", "nats3"}

func sortedKeys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// The checker itself catches the mistakes it is for.
func TestComposeCheckerCatchesUnknownVariable(t *testing.T) {
	known := knownVars(t)
	require.True(t, known["worker"]["HARVEST_WORKER_SHARD"])
	require.False(t, known["worker"]["HARVEST_WORKER_SHARDS"])
	require.False(t, known["gateway"]["HARVEST_WORKER_SHARD"])
	require.True(t, known["harvest"]["HARVEST_SHARDS"])
	require.Equal(t, "worker", binary(service{Command: []any{"worker"}}))
	require.Equal(t, "", binary(service{Command: []any{"-c", "/etc/nats/nats.conf"}}))
}
