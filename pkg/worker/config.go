package worker

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Config is a worker's configuration. LoadConfig fills it from HARVEST_*
// variables; code that embeds the runtime may also build it by hand,
// starting from DefaultConfig.
type Config struct {
	config.Common

	Shard  int                `envconfig:"WORKER_SHARD" default:"0" desc:"index in HARVEST_SHARDS of the shard this worker serves"`
	Queues map[string]float64 `envconfig:"WORKER_QUEUES" default:"default:1" desc:"queues served, with their share of the claims (queue:weight,...)"`

	FairnessKeys        bool `envconfig:"WORKER_FAIRNESS_KEYS" default:"false" desc:"serve the fairness keys of each queue in weighted round robin"`
	MaxConcurrentClaims int  `envconfig:"WORKER_MAX_CONCURRENT_CLAIMS" default:"50" desc:"the number of tasks run at once: claim loops of one task each, or, with HARVEST_WORKER_CLAIM_BATCH above 1, task slots filled by batch claims"`
	PriorityAgingSecs   int  `envconfig:"WORKER_PRIORITY_AGING_SECS" default:"0" desc:"raise a waiting task by one priority level per this many seconds (0: off)"`

	ClaimBatch    int `envconfig:"WORKER_CLAIM_BATCH" default:"50" desc:"most tasks one claim statement takes (1: one claim per task, each in its own loop); above 1 the worker claims in batches, runs up to HARVEST_WORKER_MAX_CONCURRENT_CLAIMS tasks at once and records completions in batches"`
	BatchClaimers int `envconfig:"WORKER_BATCH_CLAIMERS" default:"1" desc:"claim statements in flight at once when HARVEST_WORKER_CLAIM_BATCH is above 1"`
	CompleteBatch int `envconfig:"WORKER_COMPLETE_BATCH" default:"256" desc:"most completions recorded in one statement when HARVEST_WORKER_CLAIM_BATCH is above 1"`

	PollInterval      time.Duration `envconfig:"WORKER_POLL_INTERVAL" default:"1s" desc:"how often an idle claim loop looks for work without a wake-up (jittered)"`
	Lease             time.Duration `envconfig:"WORKER_LEASE" default:"30s" desc:"lease of a claimed task; a heartbeat extends it by this much"`
	HeartbeatInterval time.Duration `envconfig:"WORKER_HEARTBEAT_INTERVAL" default:"10s" desc:"time between heartbeats of a running task; must be shorter than the lease"`
	ShutdownGrace     time.Duration `envconfig:"WORKER_SHUTDOWN_GRACE" default:"30s" desc:"on SIGTERM, how long running tasks may finish before they are handed back"`
	StickyFor         time.Duration `envconfig:"WORKER_STICKY_FOR" default:"10s" desc:"how long a continuation stays reserved for the worker that made it"`
	RetryBase         time.Duration `envconfig:"WORKER_RETRY_BASE" default:"1s" desc:"first retry delay of a failed attempt; doubled per attempt, with jitter"`
	RetryMax          time.Duration `envconfig:"WORKER_RETRY_MAX" default:"5m" desc:"largest retry delay"`
	ID                string        `envconfig:"WORKER_ID" desc:"worker id recorded on claimed tasks (default: host name and process id)"`
	MetricsAddr       string        `envconfig:"WORKER_METRICS_ADDR" default:":9464" desc:"listen address of /metrics (empty: no metrics server)"`

	RunJanitor      bool          `envconfig:"WORKER_JANITOR" default:"true" desc:"run the janitor (lease rescue, promotion, recount, retention) in this worker"`
	JanitorInterval time.Duration `envconfig:"WORKER_JANITOR_INTERVAL" default:"5s" desc:"time between janitor ticks"`
	janitor.Settings
}

// DefaultConfig returns the defaults of every setting, as LoadConfig would
// with an empty environment (apart from HARVEST_SHARDS, which has none).
func DefaultConfig() Config {
	return Config{
		Common:              config.Common{NATSURL: "nats://127.0.0.1:4222"},
		Queues:              map[string]float64{"default": 1},
		MaxConcurrentClaims: 50,
		ClaimBatch:          50,
		BatchClaimers:       1,
		CompleteBatch:       256,
		PollInterval:        time.Second,
		Lease:               claim.DefaultLease,
		HeartbeatInterval:   10 * time.Second,
		ShutdownGrace:       30 * time.Second,
		StickyFor:           10 * time.Second,
		RetryBase:           time.Second,
		RetryMax:            5 * time.Minute,
		MetricsAddr:         ":9464",
		RunJanitor:          true,
		JanitorInterval:     5 * time.Second,
		Settings:            janitor.DefaultSettings(),
	}
}

// LoadConfig reads the configuration from the environment and validates it.
func LoadConfig() (Config, error) {
	var c Config
	if err := config.Load(&c); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// DefaultID is the worker id used when none is configured: host and pid.
func DefaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// QueueNames lists the configured queues in name order.
func (c Config) QueueNames() []string {
	names := make([]string, 0, len(c.Queues))
	for q := range c.Queues {
		names = append(names, q)
	}
	sort.Strings(names)
	return names
}

// Validate checks every setting and names the variable at fault. A fair
// worker also checks each queue name with the rules of the weight API, so
// an operator can always set weights for the keys of the queues it serves.
func (c Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.Shard < 0 || c.Shard >= len(c.Shards) {
		return fmt.Errorf("HARVEST_WORKER_SHARD: %d is not a shard index: HARVEST_SHARDS lists %d shards (0 to %d)",
			c.Shard, len(c.Shards), len(c.Shards)-1)
	}
	return c.validateRuntime()
}

// validateRuntime checks what the runtime itself needs (everything except
// the shard list, which an embedding service may not use).
func (c Config) validateRuntime() error {
	if len(c.Queues) == 0 {
		return errors.New("HARVEST_WORKER_QUEUES: empty: name at least one queue (queue:weight,...)")
	}
	for _, q := range c.QueueNames() {
		if q == "" {
			return errors.New("HARVEST_WORKER_QUEUES: a queue name is empty")
		}
		if w := c.Queues[q]; !(w > 0) || w > 1e6 {
			return fmt.Errorf("HARVEST_WORKER_QUEUES: queue %q: weight %v must be above 0", q, w)
		}
		if c.FairnessKeys {
			if err := fairkeys.ValidateQueueName(q); err != nil {
				return fmt.Errorf("HARVEST_WORKER_QUEUES: queue %q cannot be served with fairness keys on: its name %v, so no weight could be set for its keys", q, err)
			}
		}
	}
	switch {
	case c.MaxConcurrentClaims < 1 || c.MaxConcurrentClaims > 10000:
		return fmt.Errorf("HARVEST_WORKER_MAX_CONCURRENT_CLAIMS: %d must be from 1 to 10000", c.MaxConcurrentClaims)
	case c.ClaimBatch < 1 || c.ClaimBatch > 1000:
		return fmt.Errorf("HARVEST_WORKER_CLAIM_BATCH: %d must be from 1 to 1000", c.ClaimBatch)
	case c.ClaimBatch > 1 && (c.BatchClaimers < 1 || c.BatchClaimers > 64):
		return fmt.Errorf("HARVEST_WORKER_BATCH_CLAIMERS: %d must be from 1 to 64", c.BatchClaimers)
	case c.ClaimBatch > 1 && (c.CompleteBatch < 1 || c.CompleteBatch > 10000):
		return fmt.Errorf("HARVEST_WORKER_COMPLETE_BATCH: %d must be from 1 to 10000", c.CompleteBatch)
	case c.PriorityAgingSecs < 0:
		return fmt.Errorf("HARVEST_WORKER_PRIORITY_AGING_SECS: %d must not be negative", c.PriorityAgingSecs)
	case c.PollInterval <= 0:
		return fmt.Errorf("HARVEST_WORKER_POLL_INTERVAL: %s must be positive", c.PollInterval)
	case c.Lease < time.Millisecond:
		return fmt.Errorf("HARVEST_WORKER_LEASE: %s must be at least 1ms", c.Lease)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.Lease:
		return fmt.Errorf("HARVEST_WORKER_HEARTBEAT_INTERVAL: %s must be positive and shorter than HARVEST_WORKER_LEASE (%s)", c.HeartbeatInterval, c.Lease)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("HARVEST_WORKER_SHUTDOWN_GRACE: %s must not be negative", c.ShutdownGrace)
	case c.StickyFor < 0:
		return fmt.Errorf("HARVEST_WORKER_STICKY_FOR: %s must not be negative", c.StickyFor)
	case c.RetryBase <= 0:
		return fmt.Errorf("HARVEST_WORKER_RETRY_BASE: %s must be positive", c.RetryBase)
	case c.RetryMax < c.RetryBase:
		return fmt.Errorf("HARVEST_WORKER_RETRY_MAX: %s must be at least HARVEST_WORKER_RETRY_BASE (%s)", c.RetryMax, c.RetryBase)
	case c.RunJanitor && c.JanitorInterval <= 0:
		return fmt.Errorf("HARVEST_WORKER_JANITOR_INTERVAL: %s must be positive", c.JanitorInterval)
	}
	return c.Settings.Validate()
}
