package worker

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Config is a worker's configuration. Start from DefaultConfig and change
// what differs; New checks it with Validate. The stock binary fills it from
// HARVEST_* environment variables (see docs/operations.md); this package
// reads no environment.
type Config struct {
	// Shard is the number of the shard whose pool New is given, as the
	// gateways route to it: it names the NATS subjects the worker listens
	// on and labels its metrics.
	Shard int
	// Queues are the queues served, each with its share of the claims.
	Queues map[string]float64

	// FairnessKeys claims each queue's tasks in weighted fair order of
	// their fairness keys (start-time fair queuing) instead of FIFO.
	FairnessKeys bool
	// MaxConcurrentClaims is the number of tasks run at once: claim loops
	// of one task each, or, with ClaimBatch above 1, task slots filled by
	// batch claims.
	MaxConcurrentClaims int
	// PriorityAgingSecs raises a waiting task by one priority level per
	// this many seconds (0: off).
	PriorityAgingSecs int

	// ClaimBatch is the most tasks one claim statement takes (1: one claim
	// per task, each slot in its own loop).
	ClaimBatch int
	// BatchClaimers is the number of claim statements in flight at once
	// when ClaimBatch is above 1.
	BatchClaimers int
	// CompleteBatch is the most outcomes (completions, continuations,
	// failures, releases) recorded in one statement. With ClaimBatch 1, 0
	// means DefaultCompleteBatch.
	CompleteBatch int

	// PollInterval is how often an idle claim loop looks for work without
	// a wake-up (jittered).
	PollInterval time.Duration
	// Lease is the lease of a claimed task; a heartbeat extends it by as
	// much.
	Lease time.Duration
	// HeartbeatInterval is the time between heartbeats: every interval one
	// statement extends the leases of all the tasks the worker runs.
	// Shorter than Lease.
	HeartbeatInterval time.Duration
	// ShutdownGrace is how long running tasks may finish once Run's
	// context ends before they are handed back.
	ShutdownGrace time.Duration
	// StickyFor is how long a continuation stays reserved for the worker
	// that made it.
	StickyFor time.Duration
	// RetryBase is the first retry delay of a failed attempt, doubled per
	// attempt with jitter, up to RetryMax.
	RetryBase time.Duration
	RetryMax  time.Duration
	// DefaultTimeout bounds each attempt of a run that was started without
	// a timeout of its own: its handler's context ends with
	// ErrAttemptTimeout then, as with a run's timeout. Without it a handler
	// that never returns would hold its task slot for ever, its heartbeats
	// keeping the lease alive.
	DefaultTimeout time.Duration
	// ID is recorded on claimed tasks (empty: DefaultID).
	ID string
	// PresenceInterval is how often the worker renews its presence rows,
	// which say it serves its queues (0: DefaultPresenceInterval).
	PresenceInterval time.Duration

	// RunJanitor runs the shard's maintenance (lease rescue, promotion,
	// recount, retention, deferred starts) in this worker, every
	// JanitorInterval. Any number of workers may run it.
	RunJanitor      bool
	JanitorInterval time.Duration
	// Janitor configures the maintenance.
	Janitor JanitorConfig
}

// JanitorConfig configures the shard maintenance a worker runs. The worker
// hands it to the janitor by a type conversion, which keeps its fields and
// the janitor's in step: a field the janitor reads must be added here too,
// or the module does not build.
type JanitorConfig struct {
	// Retention is how long finished runs and their tasks are kept.
	Retention time.Duration
	// BucketGC drops idle rate-limit buckets; idle fairness state is
	// pruned only while it is on.
	BucketGC bool
	// BucketIdleWindow is how long a rate bucket or fairness key must be
	// untouched to count as idle.
	BucketIdleWindow time.Duration
	// FairRepairInterval is how often one janitor of the shard rebuilds
	// the fair claim's key heads from the task rows (0: never).
	FairRepairInterval time.Duration
	// FairPruneInterval is how often one janitor of the shard prunes idle
	// fairness state, taking each fair queue's lock in turn (0: every
	// tick).
	FairPruneInterval time.Duration
	// RecountInterval is how often one janitor of the shard checks the
	// tenants' running counts against their unfinished runs and heals a
	// count that drifted, a read of every unfinished run of the shard (0:
	// every tick).
	RecountInterval time.Duration
	// AuditRetention is how long audit rows are kept; older ones are
	// deleted in batches (0: kept for ever, which the janitor logs as a
	// warning when it starts).
	AuditRetention time.Duration
}

// Defaults of Config.
//
// DefaultMaxConcurrentClaims is 100 task slots, as River's and Hatchet's
// examples give a worker: a task holds its slot while its handler runs,
// and workflow steps mostly wait (on a call, a sleep, a child). With 50
// the soak's mix on a 2-core machine ran out of slots, not CPU, from 600
// starts/s; 100 held 800 and 200 held 900 (docs/benchmarks.md, "Task
// slots and the mix"). In batch mode the slots share the claim loops'
// connections, so more slots open no more connections.
const (
	DefaultMaxConcurrentClaims = 100
	DefaultClaimBatch          = 50
	DefaultCompleteBatch       = 256
	DefaultPollInterval        = time.Second
	DefaultHeartbeatInterval   = 10 * time.Second
	DefaultShutdownGrace       = 30 * time.Second
	DefaultStickyFor           = 10 * time.Second
	DefaultRetryBase           = time.Second
	DefaultRetryMax            = 5 * time.Minute
	DefaultJanitorInterval     = 5 * time.Second
	// DefaultTimeout is the bound of an attempt whose run has no timeout:
	// long enough for the long jobs a run without a timeout usually is,
	// short enough that a stuck handler gives its slot back within the hour.
	DefaultTimeout            = time.Hour
	DefaultRetention          = janitor.DefaultRetention
	DefaultBucketIdleWindow   = janitor.DefaultBucketIdleWindow
	DefaultFairRepairInterval = janitor.DefaultFairRepairInterval
	DefaultFairPruneInterval  = janitor.DefaultFairPruneInterval
	DefaultRecountInterval    = janitor.DefaultRecountInterval
	DefaultAuditRetention     = janitor.DefaultAuditRetention
)

// DefaultConfig returns the defaults of every setting: shard 0, the queue
// "default", batch claims, the janitor on.
func DefaultConfig() Config {
	return Config{
		Queues:              map[string]float64{"default": 1},
		MaxConcurrentClaims: DefaultMaxConcurrentClaims,
		ClaimBatch:          DefaultClaimBatch,
		BatchClaimers:       1,
		CompleteBatch:       DefaultCompleteBatch,
		PollInterval:        DefaultPollInterval,
		Lease:               claim.DefaultLease,
		HeartbeatInterval:   DefaultHeartbeatInterval,
		ShutdownGrace:       DefaultShutdownGrace,
		StickyFor:           DefaultStickyFor,
		RetryBase:           DefaultRetryBase,
		RetryMax:            DefaultRetryMax,
		DefaultTimeout:      DefaultTimeout,
		RunJanitor:          true,
		JanitorInterval:     DefaultJanitorInterval,
		Janitor:             JanitorConfig(janitor.DefaultSettings()),
	}
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

// ConfigError is the error of Validate: the field at fault, as a Go path
// ("Queues", "Janitor.Retention"), and what is wrong with it.
type ConfigError struct {
	Field   string
	Message string
}

func (e *ConfigError) Error() string { return "worker: Config." + e.Field + ": " + e.Message }

func invalid(field, format string, args ...any) error {
	return &ConfigError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Validate checks every setting; its error is a *ConfigError naming the
// field. A fair worker also checks each queue name with the rules of the
// weight API, so that an operator can always set weights for the keys of
// the queues it serves.
func (c Config) Validate() error {
	if c.Shard < 0 {
		return invalid("Shard", "%d must not be negative", c.Shard)
	}
	if len(c.Queues) == 0 {
		return invalid("Queues", "empty: name at least one queue")
	}
	for _, q := range c.QueueNames() {
		if q == "" {
			return invalid("Queues", "a queue name is empty")
		}
		if w := c.Queues[q]; !(w > 0) || w > 1e6 {
			return invalid("Queues", "queue %q: weight %v must be above 0 and at most 1e6", q, w)
		}
		if c.FairnessKeys {
			if err := fairkeys.ValidateQueueName(q); err != nil {
				return invalid("Queues", "queue %q cannot be served with fairness keys on: its name %v, so no weight could be set for its keys", q, err)
			}
		}
	}
	switch {
	case c.MaxConcurrentClaims < 1 || c.MaxConcurrentClaims > 10000:
		return invalid("MaxConcurrentClaims", "%d must be from 1 to 10000", c.MaxConcurrentClaims)
	case c.ClaimBatch < 1 || c.ClaimBatch > 1000:
		return invalid("ClaimBatch", "%d must be from 1 to 1000", c.ClaimBatch)
	case c.ClaimBatch > 1 && (c.BatchClaimers < 1 || c.BatchClaimers > 64):
		return invalid("BatchClaimers", "%d must be from 1 to 64", c.BatchClaimers)
	case c.CompleteBatch > 10000 || c.CompleteBatch < 0 || (c.ClaimBatch > 1 && c.CompleteBatch < 1):
		return invalid("CompleteBatch", "%d must be from 1 to 10000", c.CompleteBatch)
	case c.PriorityAgingSecs < 0:
		return invalid("PriorityAgingSecs", "%d must not be negative", c.PriorityAgingSecs)
	case c.PollInterval <= 0:
		return invalid("PollInterval", "%s must be positive", c.PollInterval)
	case c.Lease < time.Millisecond:
		return invalid("Lease", "%s must be at least 1ms", c.Lease)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.Lease:
		return invalid("HeartbeatInterval", "%s must be positive and shorter than the lease (%s)", c.HeartbeatInterval, c.Lease)
	case c.ShutdownGrace < 0:
		return invalid("ShutdownGrace", "%s must not be negative", c.ShutdownGrace)
	case c.PresenceInterval < 0:
		return invalid("PresenceInterval", "%s must not be negative", c.PresenceInterval)
	case c.StickyFor < 0:
		return invalid("StickyFor", "%s must not be negative", c.StickyFor)
	case c.RetryBase <= 0:
		return invalid("RetryBase", "%s must be positive", c.RetryBase)
	case c.RetryMax < c.RetryBase:
		return invalid("RetryMax", "%s must be at least the first retry delay (%s)", c.RetryMax, c.RetryBase)
	case c.DefaultTimeout <= 0:
		return invalid("DefaultTimeout", "%s must be positive: it bounds the attempts of runs started without a timeout", c.DefaultTimeout)
	case c.RunJanitor && c.JanitorInterval <= 0:
		return invalid("JanitorInterval", "%s must be positive", c.JanitorInterval)
	case c.Janitor.Retention <= 0:
		return invalid("Janitor.Retention", "%s must be positive", c.Janitor.Retention)
	case c.Janitor.BucketGC && c.Janitor.BucketIdleWindow <= 0:
		return invalid("Janitor.BucketIdleWindow", "%s must be positive", c.Janitor.BucketIdleWindow)
	case c.Janitor.FairRepairInterval < 0:
		return invalid("Janitor.FairRepairInterval", "%s must not be negative", c.Janitor.FairRepairInterval)
	case c.Janitor.FairPruneInterval < 0:
		return invalid("Janitor.FairPruneInterval", "%s must not be negative", c.Janitor.FairPruneInterval)
	case c.Janitor.RecountInterval < 0:
		return invalid("Janitor.RecountInterval", "%s must not be negative", c.Janitor.RecountInterval)
	case c.Janitor.AuditRetention < 0:
		return invalid("Janitor.AuditRetention", "%s must not be negative (0 keeps audit rows for ever)", c.Janitor.AuditRetention)
	}
	return nil
}
