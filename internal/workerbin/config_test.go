package workerbin

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/internal/testsignal"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/worker"
)

// The stock binary reads the runtime's settings from the environment, with
// the runtime's defaults.
func TestLoadConfigFromEnvironment(t *testing.T) {
	t.Setenv("HARVEST_SHARDS", "postgres://a/s0,postgres://a/s1")
	t.Setenv("HARVEST_WORKER_SHARD", "1")
	t.Setenv("HARVEST_WORKER_QUEUES", "shared:3,batch:1")
	t.Setenv("HARVEST_WORKER_FAIRNESS_KEYS", "true")
	t.Setenv("HARVEST_RETENTION", "24h")
	var c Config
	require.NoError(t, config.Load(&c))
	require.NoError(t, c.Validate())
	w := c.Worker()
	require.Equal(t, 1, w.Shard)
	require.Equal(t, map[string]float64{"shared": 3, "batch": 1}, w.Queues)
	require.True(t, w.FairnessKeys)
	require.Equal(t, 24*time.Hour, w.Janitor.Retention)

	// Everything else is the runtime's default.
	d := worker.DefaultConfig()
	d.Shard, d.Queues, d.FairnessKeys, d.Janitor.Retention = w.Shard, w.Queues, w.FairnessKeys, w.Janitor.Retention
	require.Equal(t, d, w, "the environment's defaults are worker.DefaultConfig's")

	t.Setenv("HARVEST_WORKER_LEASE", "soon")
	require.ErrorContains(t, config.Load(&Config{}), "HARVEST_WORKER_LEASE")
}

// A bad setting is reported with the variable that holds it.
func TestConfigValidateNamesTheVariable(t *testing.T) {
	t.Setenv("HARVEST_SHARDS", "postgres://x/y")
	var base Config
	require.NoError(t, config.Load(&base))
	require.NoError(t, base.Validate())
	cases := map[string]func(*Config){
		"HARVEST_WORKER_SHARD":                 func(c *Config) { c.Shard = 1 },
		"HARVEST_WORKER_QUEUES":                func(c *Config) { c.Queues = map[string]float64{"q": 0} },
		"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS": func(c *Config) { c.MaxConcurrentClaims = 0 },
		"HARVEST_WORKER_HEARTBEAT_INTERVAL":    func(c *Config) { c.HeartbeatInterval = c.Lease },
		"HARVEST_WORKER_RETRY_MAX":             func(c *Config) { c.RetryMax = c.RetryBase / 2 },
		"HARVEST_RETENTION":                    func(c *Config) { c.Retention = 0 },
		"HARVEST_RATE_BUCKET_IDLE_WINDOW":      func(c *Config) { c.BucketIdleWindow = 0 },
		"HARVEST_SHARDS":                       func(c *Config) { c.Shards = nil },
		"HARVEST_WORKER_HANDLE_TIMEOUT":        func(c *Config) { c.HandleTimeout = 0 },
		"HARVEST_WORKER_DEFAULT_TIMEOUT":       func(c *Config) { c.DefaultTimeout = 0 },
		"HARVEST_FAIR_PRUNE_INTERVAL":          func(c *Config) { c.FairPruneInterval = -time.Second },
		"HARVEST_RECOUNT_INTERVAL":             func(c *Config) { c.RecountInterval = -time.Second },
		"HARVEST_AUDIT_RETENTION":              func(c *Config) { c.AuditRetention = -time.Hour },
	}
	for name, mutate := range cases {
		c := base
		mutate(&c)
		err := c.Validate()
		require.Error(t, err, name)
		require.True(t, strings.HasPrefix(err.Error(), name+": "), "%s: %v", name, err)
	}
}

// envField is one variable of Config, found the way envconfig finds it:
// its name, the Go field that holds it and the struct that declares it.
type envField struct {
	name  string
	index []int // into Config, for reflect.Value.FieldByIndex
	field reflect.StructField
	owner reflect.Type
}

// envFields walks t as envconfig does: embedded structs keep the prefix,
// other structs without a decoder add their own name to it, ignored fields
// are skipped.
func envFields(t reflect.Type, prefix string, index []int) []envField {
	decoder := reflect.TypeFor[envconfig.Decoder]()
	var out []envField
	for i := range t.NumField() {
		f := t.Field(i)
		idx := append(slices.Clone(index), i)
		if !f.IsExported() || f.Tag.Get("ignored") == "true" {
			continue
		}
		key := f.Tag.Get("envconfig")
		if key == "" {
			key = strings.ToUpper(f.Name)
		}
		if f.Type.Kind() == reflect.Struct && !reflect.PointerTo(f.Type).Implements(decoder) {
			inner := prefix
			if !f.Anonymous {
				inner = prefix + "_" + key
			}
			out = append(out, envFields(f.Type, inner, idx)...)
			continue
		}
		out = append(out, envField{name: prefix + "_" + key, index: idx, field: f, owner: t})
	}
	return out
}

// testValue is a valid value of f that differs from its default and from
// every other variable's (the n-th variable's), so that a value copied
// into the wrong field shows too. Variables whose validity depends on
// others, and those of types with no safe guess, are in fixed.
func testValue(t *testing.T, f envField, n int, fixed map[string]string) string {
	if v, ok := fixed[f.name]; ok {
		return v
	}
	switch {
	case f.field.Type == reflect.TypeFor[time.Duration]():
		return (time.Duration(100+n)*time.Minute + time.Duration(n+1)*time.Second).String()
	case f.field.Type.Kind() == reflect.Bool:
		return strconv.FormatBool(f.field.Tag.Get("default") != "true")
	case f.field.Type.Kind() == reflect.Int:
		return strconv.Itoa(3 + n)
	}
	t.Fatalf("%s: no test value for a %s: add one to the fixed values", f.name, f.field.Type)
	return ""
}

// Every variable of the worker binary reaches the code that uses it. The
// test sets each one to a value other than its default, builds the worker
// as the binary does, runs it, and finds every value where it is used:
// the worker's configuration, the settings its janitor runs with, the
// bridge, the demo workflows. A variable that is read and then dropped on
// the way (as HARVEST_FAIR_PRUNE_INTERVAL once was, by a copy that left it
// out) fails with its name, and so does a new variable until this test
// knows where it is used.
func TestEveryVariableReachesItsConsumer(t *testing.T) {
	pool := testsvc.NewDB(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fields := envFields(reflect.TypeFor[Config](), config.Prefix, nil)
	vars, err := envdoc.Vars(config.Prefix, &Config{})
	require.NoError(t, err)
	walked := map[string]bool{}
	for _, f := range fields {
		walked[f.name] = true
	}
	require.Equal(t, envdoc.Names(vars), walked, "the walk finds the variables envconfig reads")

	fixed := map[string]string{
		"HARVEST_SHARDS":                    "postgres://a/s0,postgres://a/s1",
		"HARVEST_NATS_URL":                  "nats://nats.test:4333",
		"HARVEST_WORKER_SHARD":              "1",
		"HARVEST_WORKER_QUEUES":             "alpha:2,beta:3",
		"HARVEST_WORKER_LEASE":              "47s",
		"HARVEST_WORKER_HEARTBEAT_INTERVAL": "13s",
		"HARVEST_WORKER_RETRY_BASE":         "3s",
		"HARVEST_WORKER_RETRY_MAX":          "7m",
		"HARVEST_WORKER_ID":                 "worker-under-test",
		"HARVEST_WORKER_METRICS_ADDR":       "127.0.0.1:19464",
		// On, as by default, so that the janitor runs and shows its
		// settings; its other value is checked below.
		"HARVEST_WORKER_JANITOR": "true",
	}
	for _, f := range fields { // the defaults, whatever the test's environment holds
		t.Setenv(f.name, "")
		require.NoError(t, os.Unsetenv(f.name))
	}
	var defaults Config
	require.NoError(t, config.Load(&defaults))
	for i, f := range fields {
		t.Setenv(f.name, testValue(t, f, i, fixed))
	}
	var cfg Config
	require.NoError(t, config.Load(&cfg))
	require.NoError(t, cfg.Validate())
	want := func(f envField) any { return reflect.ValueOf(cfg).FieldByIndex(f.index).Interface() }
	for _, f := range fields {
		if f.name != "HARVEST_WORKER_JANITOR" && reflect.DeepEqual(want(f), reflect.ValueOf(defaults).FieldByIndex(f.index).Interface()) {
			t.Errorf("%s: the test's value is the default: it would not show a drop", f.name)
		}
	}

	// Built and run as Main's run does, on a real shard, without NATS.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	opts := workerOptions(nil, cfg, log)
	w, err := newWorker(pool, cfg, opts, log)
	require.NoError(t, err)
	var startedSig testsignal.Signal[janitor.Started]
	startedSig.Init()
	runCtx, stop := context.WithCancel(janitor.WithStartedSignal(ctx, &startedSig))
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	started, err := startedSig.WaitFor(ctx, func(janitor.Started) bool { return true })
	stop()
	require.NoError(t, err, "the worker starts its janitor")
	require.NoError(t, <-done)

	// Where each value is used, by the struct that declares its variable.
	type use struct {
		where string
		got   any
	}
	wc := w.Config()
	field := func(v any, name string) any { return reflect.ValueOf(v).FieldByName(name).Interface() }
	uses := func(f envField) []use {
		name := f.field.Name
		switch f.owner {
		case reflect.TypeFor[Runtime]():
			u := []use{{"the worker's Config." + name, field(wc, name)}}
			if name == "JanitorInterval" {
				u = append(u, use{"the interval janitor.Run ticks at", started.Interval})
			}
			return u
		case reflect.TypeFor[janitor.Settings]():
			return []use{
				{"the worker's Config.Janitor." + name, field(wc.Janitor, name)},
				{"the janitor.Settings the worker runs its janitor with", field(started.Settings, name)},
			}
		}
		switch f.name {
		case "HARVEST_WORKER_HANDLE_TIMEOUT":
			b, ok := opts.Fallback.(Bridge)
			require.True(t, ok, "the fallback is the NATS bridge")
			return []use{{"the bridge's Timeout", b.Timeout}}
		case "HARVEST_WORKER_DEMO_HANDLERS":
			return []use{{"the demo workflows registered", slices.Equal(w.Workflows(), slices.Sorted(slices.Values(DemoWorkflows)))}}
		case "HARVEST_SHARDS", "HARVEST_NATS_URL", "HARVEST_WORKER_METRICS_ADDR":
			// run and connect read these from Config itself: no copy.
			return []use{{"Config." + name, want(f)}}
		}
		return nil
	}
	for _, f := range fields {
		us := uses(f)
		if len(us) == 0 {
			t.Errorf("%s: this test does not know where its value is used: add it to uses", f.name)
		}
		for _, u := range us {
			if !reflect.DeepEqual(want(f), u.got) {
				t.Errorf("%s=%v does not reach %s: it holds %v", f.name, want(f), u.where, u.got)
			}
		}
	}

	// HARVEST_WORKER_JANITOR's other value reaches the worker too.
	t.Setenv("HARVEST_WORKER_JANITOR", "false")
	var off Config
	require.NoError(t, config.Load(&off))
	w, err = newWorker(pool, off, workerOptions(nil, off, log), log)
	require.NoError(t, err)
	require.False(t, w.Config().RunJanitor, "HARVEST_WORKER_JANITOR=false reaches the worker")
}

// The demo workflows are registered only when asked for, with a warning.
func TestDemoHandlersOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	pool := testsvc.NewDB(t)
	base := Config{Runtime: Runtime(worker.DefaultConfig())}
	base.Janitor = worker.JanitorConfig{}
	base.Settings = janitor.DefaultSettings()

	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	w, err := newWorker(pool, base, workerOptions(nil, base, log), log)
	require.NoError(t, err)
	require.Empty(t, w.Workflows(), "no demo workflow by default")
	require.NotContains(t, logs.String(), "demo")

	on := base
	on.DemoHandlers = true
	w, err = newWorker(pool, on, workerOptions(nil, on, log), log)
	require.NoError(t, err)
	require.Equal(t, []string{"echo", "fail", "sleep", "steps"}, w.Workflows())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "HARVEST_WORKER_DEMO_HANDLERS=true")
}
