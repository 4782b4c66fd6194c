package workerbin

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/config"
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
	}
	for name, mutate := range cases {
		c := base
		mutate(&c)
		err := c.Validate()
		require.Error(t, err, name)
		require.True(t, strings.HasPrefix(err.Error(), name+": "), "%s: %v", name, err)
	}
}
