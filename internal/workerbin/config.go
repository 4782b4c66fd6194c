package workerbin

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/worker"
)

// Config is the stock worker's configuration as the environment gives it:
// the runtime's settings (Runtime, converted to worker.Config), the
// janitor's (janitor.Settings, converted to worker.JanitorConfig), where
// to reach the shard and NATS, the metrics listener, the bridge's reply
// timeout and the demo workflows' switch. Defaults are
// worker.DefaultConfig's.
type Config struct {
	config.Common
	Runtime
	janitor.Settings

	MetricsAddr   string        `envconfig:"WORKER_METRICS_ADDR" default:":9464" desc:"listen address of /metrics (empty: no metrics server)"`
	HandleTimeout time.Duration `envconfig:"WORKER_HANDLE_TIMEOUT" default:"5m" desc:"how long the NATS bridge waits for a service's reply (a run's timeout, when shorter, wins)"`
	DemoHandlers  bool          `envconfig:"WORKER_DEMO_HANDLERS" default:"false" desc:"also run the demo workflows echo, sleep, fail and steps in this worker, for any tenant that starts them (logged as a warning); for demos and tests only: harvest dev runs them itself"`
}

// Runtime is worker.Config as the environment gives it: the same fields,
// in the same order, with the same types, so that Config.Worker converts
// one into the other. A field added to either side alone stops the build,
// where a copy field by field would drop it without a word.
type Runtime struct {
	Shard  int                `envconfig:"WORKER_SHARD" default:"0" desc:"index in HARVEST_SHARDS of the shard this worker serves"`
	Queues map[string]float64 `envconfig:"WORKER_QUEUES" default:"default:1" desc:"queues served, with their share of the claims (queue:weight,...)"`

	FairnessKeys        bool `envconfig:"WORKER_FAIRNESS_KEYS" default:"false" desc:"claim each queue's tasks in weighted fair order of their fairness keys"`
	MaxConcurrentClaims int  `envconfig:"WORKER_MAX_CONCURRENT_CLAIMS" default:"100" desc:"the number of tasks run at once: claim loops of one task each, or, with HARVEST_WORKER_CLAIM_BATCH above 1, task slots filled by batch claims"`
	PriorityAgingSecs   int  `envconfig:"WORKER_PRIORITY_AGING_SECS" default:"0" desc:"raise a waiting task by one priority level per this many seconds (0: off)"`

	ClaimBatch    int `envconfig:"WORKER_CLAIM_BATCH" default:"50" desc:"most tasks one claim statement takes (1: one claim per task, each in its own loop); above 1 the worker claims in batches, runs up to HARVEST_WORKER_MAX_CONCURRENT_CLAIMS tasks at once and records outcomes in batches"`
	BatchClaimers int `envconfig:"WORKER_BATCH_CLAIMERS" default:"1" desc:"claim statements in flight at once when HARVEST_WORKER_CLAIM_BATCH is above 1"`
	CompleteBatch int `envconfig:"WORKER_COMPLETE_BATCH" default:"256" desc:"most outcomes (completions, continuations, failures, hand-backs) recorded in one statement"`

	PollInterval      time.Duration `envconfig:"WORKER_POLL_INTERVAL" default:"1s" desc:"how often an idle claim loop looks for work without a wake-up (jittered)"`
	Lease             time.Duration `envconfig:"WORKER_LEASE" default:"30s" desc:"lease of a claimed task; a heartbeat extends it by this much"`
	HeartbeatInterval time.Duration `envconfig:"WORKER_HEARTBEAT_INTERVAL" default:"10s" desc:"time between the worker's heartbeats, each one statement extending the leases of all its running tasks; must be shorter than the lease"`
	ShutdownGrace     time.Duration `envconfig:"WORKER_SHUTDOWN_GRACE" default:"30s" desc:"on SIGTERM, how long running tasks may finish before they are handed back"`
	StickyFor         time.Duration `envconfig:"WORKER_STICKY_FOR" default:"10s" desc:"how long a continuation stays reserved for the worker that made it"`
	RetryBase         time.Duration `envconfig:"WORKER_RETRY_BASE" default:"1s" desc:"first retry delay of a failed attempt; doubled per attempt, with jitter"`
	RetryMax          time.Duration `envconfig:"WORKER_RETRY_MAX" default:"5m" desc:"largest retry delay"`
	DefaultTimeout    time.Duration `envconfig:"WORKER_DEFAULT_TIMEOUT" default:"1h" desc:"bound of each attempt of a run started without a timeout (a run's own timeout wins): a handler still running then is cancelled and the attempt fails"`
	ID                string        `envconfig:"WORKER_ID" desc:"worker id recorded on claimed tasks (default: host name and process id)"`
	// PresenceInterval keeps the runtime's default: no variable sets it.
	PresenceInterval time.Duration `ignored:"true"`

	RunJanitor      bool          `envconfig:"WORKER_JANITOR" default:"true" desc:"run the janitor (lease rescue, promotion, recount, retention) in this worker"`
	JanitorInterval time.Duration `envconfig:"WORKER_JANITOR_INTERVAL" default:"5s" desc:"time between janitor ticks"`
	// Janitor is filled by Config.Worker from the janitor's own variables
	// (Config's janitor.Settings), which keep their names without WORKER_.
	Janitor worker.JanitorConfig `ignored:"true"`
}

// Worker is the runtime's part of the configuration. Both halves are type
// conversions, checked by the compiler, so no variable can be read and
// then dropped on its way to the runtime.
func (c Config) Worker() worker.Config {
	w := worker.Config(c.Runtime)
	w.Janitor = worker.JanitorConfig(c.Settings)
	return w
}

// Validate checks the configuration and names the variable at fault.
func (c Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.Shard < 0 || c.Shard >= len(c.Shards) {
		return fmt.Errorf("HARVEST_WORKER_SHARD: %d is not a shard index: HARVEST_SHARDS lists %d shards (0 to %d)",
			c.Shard, len(c.Shards), len(c.Shards)-1)
	}
	if err := c.Worker().Validate(); err != nil {
		return envError(err)
	}
	if c.HandleTimeout <= 0 {
		return fmt.Errorf("HARVEST_WORKER_HANDLE_TIMEOUT: %s must be positive", c.HandleTimeout)
	}
	return nil
}

// envError names the variable of a worker.Config field in its error: the
// field of Config with the same name (the janitor's by its last part).
func envError(err error) error {
	var ce *worker.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name := ce.Field[strings.LastIndex(ce.Field, ".")+1:]
	if f, ok := reflect.TypeFor[Config]().FieldByName(name); ok {
		if tag := f.Tag.Get("envconfig"); tag != "" {
			return fmt.Errorf("%s_%s: %s", config.Prefix, tag, ce.Message)
		}
	}
	return err
}
