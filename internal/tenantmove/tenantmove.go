package tenantmove

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/directory"
)

// Defaults of Options.
const (
	// DefaultBatch is how many runs one copy step moves.
	DefaultBatch = 500
	// DefaultPoll is how long a move waits before it looks again at runs
	// it could not move yet (a task running, a deferred start waiting).
	DefaultPoll = 200 * time.Millisecond
)

// Options configure Move, Pin and List.
type Options struct {
	// Shards are the shard pools in shard order; Shards[0] holds the
	// directory and the capacity ledger. Required.
	Shards []*pgxpool.Pool
	// NATS and Prefix, when NATS is set, announce each change of the
	// tenant's entry to the gateways (directory.Announce).
	NATS   *nats.Conn
	Prefix string
	// MaxRuns is the system limit the capacity ledger divides
	// (HARVEST_MAX_RUNS); the new home takes capacity for the runs it
	// receives.
	MaxRuns int
	// Batch is the most runs one copy step moves (DefaultBatch when zero).
	Batch int
	// Poll is the wait between passes (DefaultPoll when zero).
	Poll time.Duration
	// Progress, when set, sees every step once it has committed.
	Progress func(Step)
	// AfterStep is a test signal: when set, it is called after every step
	// has committed, and an error it returns ends the move at once, as a
	// crash there would. Nil in production.
	AfterStep func(Step) error
	Log       *slog.Logger
}

// Step is one committed step of a move.
type Step struct {
	// Name is the step: "intent", "fence", "prepare", "deferred",
	// "switch", "hide", "copy", "drop", "settle" or "done"; Progress also
	// hears "wait" (runs left whose tasks run) and "capacity" (the new
	// home's lease is short), which commit nothing.
	Name string
	// Batch counts the copy batches so far (hide, copy, drop).
	Batch int
	// Runs is how many runs the step moved or took off the old home.
	Runs int
	// Waiting is how many runs are still on the old home (prepare: its
	// unfinished ones; drop and wait: all of them). For "capacity", a
	// report that the copy waits for room on the new home, Runs is the
	// lease the new home needs and Waiting the lease it has.
	Waiting int
}

// Report says what a move did.
type Report struct {
	Tenant  string
	From    int
	To      int
	Runs    int // runs copied, finished ones included
	Batches int
	// AlreadyHome is true when the tenant's home was the target already.
	AlreadyHome bool
	Elapsed     time.Duration
}

// Tenant is one line of List.
type Tenant struct {
	Tenant string `json:"tenant"`
	// Home is the recorded home, or, for a tenant with runs but no entry
	// (placed before the directory existed), -1.
	Home  int             `json:"home"`
	Entry directory.Entry `json:"entry"`
	// Unfinished is the tenant's count of unfinished runs over all shards.
	Unfinished int64 `json:"unfinished"`
	// Keys is how many fairness keys of the tenant (the tenant's name, or
	// names under "<tenant>/") have state on its home shard.
	Keys int64 `json:"keys"`
}

// Move moves the tenant's home to shard to, online, and copies its runs
// there; run again after a crash it finishes the move it finds.
func Move(ctx context.Context, o Options, tenant string, to int) (Report, error) {
	return move(ctx, o, tenant, to)
}

// Pin records shard as the home of a tenant that has no runs anywhere.
func Pin(ctx context.Context, o Options, tenant string, shard int) (directory.Entry, error) {
	return pin(ctx, o, tenant, shard)
}

// List returns every tenant the directory or a shard knows of.
func List(ctx context.Context, o Options) ([]Tenant, error) {
	return list(ctx, o)
}

// withDefaults fills the zero fields of o.
func (o Options) withDefaults() Options {
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}
