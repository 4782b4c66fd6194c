package janitor

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/internal/testsignal"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlTryLock          = sqlfile.Must(sqlFiles, "JanitorTryLock")
	sqlRunDeleteFinal   = sqlfile.Must(sqlFiles, "RunDeleteFinished")
	sqlBucketDeleteIdle = sqlfile.Must(sqlFiles, "RateBucketDeleteIdle")
	sqlJobDue           = sqlfile.Must(sqlFiles, "JanitorJobDue")
	sqlFairVacuum       = sqlfile.Must(sqlFiles, "FairVacuum")
	sqlClockNow         = sqlfile.Must(sqlFiles, "ClockNow")
	sqlAuditDelete      = sqlfile.Must(sqlFiles, "AuditDeleteExpired")
	sqlAnalyzeDue       = sqlfile.Must(sqlFiles, "TableAnalyzeDue")
)

// Settings are the janitor's knobs. The envconfig tags read them from
// HARVEST_RETENTION, HARVEST_RATE_BUCKET_GC and the others below when the
// struct is embedded in a binary's configuration.
//
// pkg/worker's JanitorConfig has the same fields, in the same order, with
// the same types: the worker converts one into the other
// (janitor.Settings(cfg)), so a field added here and not there, or the
// other way round, stops the build instead of being dropped on the way.
type Settings struct {
	Retention          time.Duration `envconfig:"RETENTION" default:"168h" desc:"delete finished runs and their tasks this long after they finished"`
	BucketGC           bool          `envconfig:"RATE_BUCKET_GC" default:"true" desc:"drop idle rate-limit buckets on each janitor tick; idle fairness state is pruned only while this is on"`
	BucketIdleWindow   time.Duration `envconfig:"RATE_BUCKET_IDLE_WINDOW" default:"1h" desc:"a rate bucket or fairness key untouched this long counts as idle"`
	FairRepairInterval time.Duration `envconfig:"FAIR_REPAIR_INTERVAL" default:"1m" desc:"how often one janitor of the shard rebuilds the fair claim's key heads from the task rows while claims go on (0: never)"`
	FairPruneInterval  time.Duration `envconfig:"FAIR_PRUNE_INTERVAL" default:"1m" desc:"how often one janitor of the shard prunes idle fairness state, taking each fair queue's lock in turn (0: every tick)"`
	RecountInterval    time.Duration `envconfig:"RECOUNT_INTERVAL" default:"1m" desc:"how often one janitor of the shard checks each tenant's running count against its unfinished runs and heals a count that drifted; the check reads every unfinished run of the shard (0: every tick)"`
	AuditRetention     time.Duration `envconfig:"AUDIT_RETENTION" default:"2160h" desc:"delete audit rows this long after they were written, in batches (0: keep them for ever, logged as a warning at start)"`
}

// DefaultRetention is how long finished runs and their tasks are kept.
const DefaultRetention = 7 * 24 * time.Hour

// DefaultBucketIdleWindow is how long a rate bucket or fairness key must be
// untouched to count as idle.
const DefaultBucketIdleWindow = time.Hour

// DefaultFairRepairInterval is how often the fairness heads are rebuilt from
// the task rows. They only go wrong when something writes tasks past the
// triggers (a bulk load with them disabled, a hand edit), so this is a
// safety net, not upkeep the claim depends on.
const DefaultFairRepairInterval = time.Minute

// DefaultFairPruneInterval is how often idle fairness state is pruned. A
// key counts as idle after BucketIdleWindow (an hour), so pruning more
// often finds nothing more; each prune takes every fair queue's lock in
// turn, and from every janitor on every tick that was a turn taken from
// the claims several times a second (docs/reliability.md).
const DefaultFairPruneInterval = time.Minute

// DefaultRecountInterval is how often the running counts are checked
// against the unfinished runs. A start or a finish changes its run and the
// counts in one transaction, so only a hand edit or a bug makes them
// drift: the check is a safety net. It reads every unfinished run of the
// shard, which grows with the backlog (half a second of CPU at a million
// queued runs), so it is not run on every tick.
const DefaultRecountInterval = time.Minute

// DefaultAuditRetention is how long audit rows are kept: 90 days, long
// enough to look back over a quarter's changes, short enough that rows a
// tenant can cause (its own weight changes, folded refusals) cannot grow
// a shard's audit table without bound.
const DefaultAuditRetention = 90 * 24 * time.Hour

// DefaultSettings returns the defaults of the Settings fields.
func DefaultSettings() Settings {
	return Settings{Retention: DefaultRetention, BucketGC: true, BucketIdleWindow: DefaultBucketIdleWindow,
		FairRepairInterval: DefaultFairRepairInterval, FairPruneInterval: DefaultFairPruneInterval,
		RecountInterval: DefaultRecountInterval, AuditRetention: DefaultAuditRetention}
}

// Report is what one tick did: its counts, and the runs it fired.
type Report struct {
	Counts
	// DeferredStarted lists the runs this tick fired, once committed. The
	// janitor has no NATS connection of its own: its caller announces them
	// (see WakeQueues), so that workers waiting for work of those queues
	// claim at once instead of at their next poll.
	DeferredStarted []runstore.Committed
}

// Counts count what one tick did. pkg/worker's JanitorReport has the same
// fields in the same order and is converted from it, so that a count added
// here reaches the worker's hook or stops the build.
type Counts struct {
	Requeued       int  // expired leases put back as pending
	FailedRuns     int  // runs failed because an expired lease used their last attempt
	Promoted       int  // scheduled tasks made claimable
	Exclusive      bool // this janitor held the lock for the jobs below
	Recounted      int  // tenants whose running count was wrong and was fixed (checked once per RecountInterval)
	DeletedRuns    int  // finished runs deleted past the retention period
	DeletedAudit   int  // audit rows deleted past the audit retention
	DeletedBuckets int  // idle rate buckets dropped
	PrunedKeys     int  // idle fairness state rows pruned
	// RepairedKeys counts keys whose fairness head was missing or wrong and
	// was rebuilt from the task rows (exclusive, at most once per
	// FairRepairInterval); nonzero means something wrote tasks past the
	// triggers.
	RepairedKeys int
	// Deferred starts (throttle, debounce, batch): runs fired because their
	// time came, groups closed because their waiting run was cancelled,
	// and finished groups pruned (exclusive).
	DeferredFired     int
	DeferredCancelled int
	DeferredPruned    int
	// Analyzed counts tables analyzed because their statistics fell
	// behind their writes (exclusive; only where autovacuum is off or
	// behind). A table another process held at that moment is counted
	// and left for a later tick.
	Analyzed int
}

// WakeQueues counts the fired runs by queue, leaving out those whose first
// task is not due yet: what a wake-up per queue should announce.
func (r Report) WakeQueues() map[string]int {
	var out map[string]int
	for _, c := range r.DeferredStarted {
		req := &c.Params.Req
		if req.RunAt != nil || (req.Delay != nil && *req.Delay > 0) {
			continue
		}
		if out == nil {
			out = map[string]int{}
		}
		out[req.Queue]++
	}
	return out
}

// Tick runs every job once: first the jobs every janitor runs, then, when
// it gets the shard's janitor lock, the jobs one janitor per tick is
// enough for (see jobs.go). A failure of the deferred firing does not hold
// back the jobs after it; any other failure ends the tick.
func Tick(ctx context.Context, db shard.Beginner, s Settings) (Report, error) {
	var rep Report
	var errs []error
	for _, j := range sharedJobs {
		if err := j.run(ctx, db, s, &rep); err != nil {
			err = fmt.Errorf("janitor: %s: %w", j.name(), err)
			if !j.tolerant() {
				return rep, errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
		}
	}
	if err := exclusive(ctx, db, s, &rep); err != nil {
		errs = append(errs, fmt.Errorf("janitor: %w", err))
	}
	return rep, errors.Join(errs...)
}

// exclusive runs the jobs that one janitor per tick is enough for: those
// of lockedJobs inside the transaction that holds the shard's janitor
// lock, then those of afterJobs once it committed.
func exclusive(ctx context.Context, db shard.Beginner, s Settings, rep *Report) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if err := tx.QueryRow(ctx, sqlTryLock).Scan(&rep.Exclusive); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	if !rep.Exclusive {
		return nil
	}
	t := &lockedTick{tx: tx, s: s, rep: rep}
	if err := tx.QueryRow(ctx, sqlClockNow).Scan(&t.now); err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	for _, j := range lockedJobs {
		if err := j.runLocked(ctx, t); err != nil {
			return fmt.Errorf("%s: %w", j.name(), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	// The jobs on the fair claim's state and the counts run after the
	// commit, each in statements of its own: inside the tick's transaction
	// they would hold every queue's fair lock, or every count row, and so
	// stall every claim or start of the shard until the tick ended.
	for _, j := range afterJobs {
		if err := j.runAfter(ctx, db, t); err != nil {
			return fmt.Errorf("%s: %w", j.name(), err)
		}
	}
	return nil
}

// Run ticks every interval until ctx ends (a Loop with these fields).
func Run(ctx context.Context, db shard.Beginner, s Settings, interval time.Duration, log *slog.Logger, onTick func(Report, error)) {
	(&Loop{DB: db, Settings: s, Interval: interval, Log: log, OnTick: onTick}).Run(ctx)
}

// Loop is the janitor of one shard: a Tick every Interval until its
// context ends. A failed tick is logged and the next one tries again.
type Loop struct {
	DB       shard.Beginner
	Settings Settings
	Interval time.Duration
	Log      *slog.Logger // slog.Default() when nil
	// OnTick, when set, sees every tick's report: the worker announces the
	// runs a tick fired (Report.DeferredStarted) from it.
	OnTick func(Report, error)
	// TestSignals let tests wait for the loop; they do nothing until a test
	// initialises them.
	TestSignals TestSignals
}

// TestSignals are what a Loop signals to a test.
type TestSignals struct {
	// Ticked carries every tick's report, after the tick (also a failed
	// one's, with its error).
	Ticked testsignal.Signal[Ticked]
}

// Started is what a Loop signals as it starts: the settings and the
// interval it was given.
type Started struct {
	Settings Settings
	Interval time.Duration
}

type startedKey struct{}

// WithStartedSignal returns a context under which a Loop signals sig once,
// as it starts. The janitor runs inside the worker, so a test cannot reach
// its Loop; through the context the worker's Run passes down, it sees the
// settings the worker handed the janitor (internal/workerbin's test of
// every variable). Only tests call it.
func WithStartedSignal(ctx context.Context, sig *testsignal.Signal[Started]) context.Context {
	return context.WithValue(ctx, startedKey{}, sig)
}

// Ticked is one tick as TestSignals.Ticked carries it.
type Ticked struct {
	Report
	Err error
}

// Run ticks until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	log := l.Log
	if log == nil {
		log = slog.Default()
	}
	if sig, ok := ctx.Value(startedKey{}).(*testsignal.Signal[Started]); ok {
		sig.Signal(Started{Settings: l.Settings, Interval: l.Interval})
	}
	if l.Settings.AuditRetention <= 0 {
		log.Warn("janitor keeps audit rows for ever: the audit retention (HARVEST_AUDIT_RETENTION) is 0")
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		rep, err := Tick(ctx, l.DB, l.Settings)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("janitor tick failed", "err", err)
		case rep.Requeued+rep.FailedRuns > 0:
			log.Info("janitor rescued expired leases", "requeued", rep.Requeued, "failed_runs", rep.FailedRuns)
		}
		if rep.DeferredFired > 0 {
			log.Debug("janitor fired deferred starts", "runs", rep.DeferredFired)
		}
		if rep.Analyzed > 0 {
			log.Debug("janitor analyzed tables whose statistics fell behind (autovacuum off or behind)", "tables", rep.Analyzed)
		}
		if rep.Recounted > 0 {
			log.Warn("janitor fixed running counts", "tenants", rep.Recounted)
		}
		if rep.RepairedKeys > 0 {
			log.Warn("janitor rebuilt fairness heads that were missing or wrong (tasks were written past the triggers)",
				"keys", rep.RepairedKeys)
		}
		if !errors.Is(err, context.Canceled) {
			if l.OnTick != nil {
				l.OnTick(rep, err)
			}
			l.TestSignals.Ticked.Signal(Ticked{Report: rep, Err: err})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
