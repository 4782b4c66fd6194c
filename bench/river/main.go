// Command river-bench runs Harvest's fleet workload on River, so that
// `harvest-bench fleet --vs-river` can put the two side by side.
//
// It creates a throwaway database, migrates River's schema into it, inserts a
// backlog of no-op jobs for one tenant, starts one River client, trickles in a
// second tenant's jobs while the backlog drains, then reads the exact timings
// back from river_job and prints one JSON line on stdout. Progress goes to
// stderr. See README.md for what each figure means.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

type config struct {
	databaseURL   string
	flood         int
	slots         int
	lightRate     float64
	maxDuration   time.Duration
	keepDB        bool
	poolSize      int
	fetchCooldown time.Duration
}

// result is the JSON line. The first ten fields are the ones the fleet
// benchmark reads; the rest are there so a reader can judge the run.
type result struct {
	Bench          string  `json:"bench"`
	Flood          int     `json:"flood"`
	Slots          int     `json:"slots"`
	DrainS         float64 `json:"drain_s"`
	TasksPerS      float64 `json:"tasks_per_s"`
	LightJobs      int     `json:"light_jobs"`
	LightWaitP50MS float64 `json:"light_wait_p50_ms"`
	LightWaitP99MS float64 `json:"light_wait_p99_ms"`
	LightWaitMaxMS float64 `json:"light_wait_max_ms"`
	PeakRSSMB      float64 `json:"peak_rss_mb"`

	Drained         bool    `json:"drained"`
	FloodCompleted  int64   `json:"flood_completed"`
	Completed       int64   `json:"completed"`
	StartupS        float64 `json:"startup_s"`
	LightRate       float64 `json:"light_rate"`
	LightInserted   int64   `json:"light_inserted"`
	LightUnstarted  int64   `json:"light_unstarted"`
	FetchCooldownMS float64 `json:"fetch_cooldown_ms"`
	PoolSize        int     `json:"pool_size"`
	RiverVersion    string  `json:"river_version"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sustain" {
		// River's side of harvest-bench sustain --vs-river (sustain.go).
		os.Exit(sustainMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg := config{databaseURL: os.Getenv("HARVEST_DATABASE_URL")}
	if cfg.databaseURL == "" {
		cfg.databaseURL = defaultDatabaseURL
	}
	flag.StringVar(&cfg.databaseURL, "database-url", cfg.databaseURL, "server to create the throwaway database on (default: $HARVEST_DATABASE_URL, else "+defaultDatabaseURL+")")
	flag.IntVar(&cfg.flood, "flood", 100_000, "no-op jobs pre-inserted for the heavy tenant")
	flag.IntVar(&cfg.slots, "slots", 100, "concurrent job slots (MaxWorkers of the one queue)")
	flag.Float64Var(&cfg.lightRate, "light-rate", 1, "light tenant's jobs per second, from 1 s into the drain")
	flag.DurationVar(&cfg.maxDuration, "max-duration", 10*time.Minute, "give up if the flood has not drained by then")
	flag.BoolVar(&cfg.keepDB, "keep-db", false, "leave the database in place for inspection")
	flag.IntVar(&cfg.poolSize, "pool-size", 10, "pgx pool size (max connections) of the River client")
	flag.DurationVar(&cfg.fetchCooldown, "fetch-cooldown", 0, "River FetchCooldown; 0 keeps River's default (100ms)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "river-bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res, err := run(ctx, cfg, os.Stderr)
	if res != nil {
		line, jerr := json.Marshal(res)
		if jerr != nil {
			err = errors.Join(err, jerr)
		} else {
			fmt.Println(string(line))
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "river-bench: error: %v\n", err)
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.flood < 1:
		return errors.New("-flood must be at least 1")
	case c.slots < 1 || c.slots > 10_000:
		return errors.New("-slots must be between 1 and 10000 (River's MaxWorkers range)")
	case c.lightRate <= 0 || c.lightRate > 1000:
		return errors.New("-light-rate must be above 0 and at most 1000 jobs/s")
	case c.maxDuration <= time.Second:
		return errors.New("-max-duration must be more than 1s")
	case c.poolSize < 2:
		return errors.New("-pool-size must be at least 2")
	case c.fetchCooldown != 0 && c.fetchCooldown < river.FetchCooldownMin:
		return fmt.Errorf("-fetch-cooldown must be at least %s", river.FetchCooldownMin)
	}
	return nil
}

func run(ctx context.Context, cfg config, logw io.Writer) (res *result, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(logw, "river-bench: "+format+"\n", args...)
	}

	name, err := randomDBName()
	if err != nil {
		return nil, err
	}
	if err := createDatabase(ctx, cfg.databaseURL, name); err != nil {
		return nil, err
	}
	logf("created database %s", name)
	defer func() {
		if cfg.keepDB {
			logf("kept database %s (-keep-db)", name)
			return
		}
		if derr := dropDatabase(cfg.databaseURL, name); derr != nil {
			err = errors.Join(err, derr)
			return
		}
		logf("dropped database %s", name)
	}()

	pool, err := openPool(ctx, cfg.databaseURL, name, int32(cfg.poolSize))
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	n, err := migrate(ctx, pool)
	if err != nil {
		return nil, err
	}
	logf("applied %d River migrations", n)

	var floodWorked atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &floodWorker{worked: &floodWorked})
	river.AddWorker(workers, &lightWorker{})

	riverCfg := &river.Config{
		Queues:  map[string]river.QueueConfig{benchQueue: {MaxWorkers: cfg.slots}},
		Workers: workers,
		// River logs to stdout unless told otherwise; stdout is for the
		// JSON line only.
		Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		// Keep every completed row: the figures are read from them.
		CompletedJobRetentionPeriod: -1,
		FetchCooldown:               cfg.fetchCooldown,
	}
	if cfg.fetchCooldown > time.Second {
		riverCfg.FetchPollInterval = cfg.fetchCooldown
	}
	client, err := river.NewClient(riverpgxv5.New(pool), riverCfg)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}

	if err := insertFlood(ctx, client, cfg.flood, logf); err != nil {
		return nil, err
	}
	// A bulk load leaves the table without planner statistics until
	// autovacuum gets to it; analyze now so the drain starts from the
	// steady state a long-lived queue would be in.
	if _, err := pool.Exec(ctx, "ANALYZE river_job"); err != nil {
		return nil, fmt.Errorf("analyze river_job: %w", err)
	}

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("start river client: %w", err)
	}
	logf("client started: %d slots on queue %s; light tenant at %g jobs/s from 1s in", cfg.slots, benchQueue, cfg.lightRate)
	clientStopped := false
	stopClient := func() error {
		if clientStopped {
			return nil
		}
		clientStopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(sctx); err != nil {
			return fmt.Errorf("stop river client: %w", err)
		}
		return nil
	}
	defer func() {
		if serr := stopClient(); serr != nil {
			err = errors.Join(err, serr)
		}
	}()

	// The light tenant: one job every 1/rate seconds, on a fixed schedule
	// counted from the start of the drain.
	lightCtx, stopLight := context.WithCancel(ctx)
	defer stopLight()
	var lightSent atomic.Int64
	lightErr := make(chan error, 1)
	var lightWG sync.WaitGroup
	lightWG.Go(func() {
		interval := time.Duration(float64(time.Second) / cfg.lightRate)
		for i := 0; ; i++ {
			due := start.Add(time.Second + time.Duration(i)*interval)
			t := time.NewTimer(time.Until(due))
			select {
			case <-lightCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			_, err := client.Insert(lightCtx, LightArgs{Tenant: "light", Seq: i}, nil)
			if err != nil {
				if lightCtx.Err() == nil {
					lightErr <- fmt.Errorf("insert light job %d: %w", i, err)
				}
				return
			}
			lightSent.Add(1)
		}
	})

	drained, err := waitDrained(ctx, pool, cfg, start, &floodWorked, &lightSent, lightErr, logf)
	stopLight()
	lightWG.Wait()
	if err != nil {
		return nil, err
	}
	if drained {
		// Let the light jobs still queued behind the flood run, so each has
		// an attempted_at to read.
		if err := waitLightDone(ctx, pool, logf); err != nil {
			return nil, err
		}
	}
	if err := stopClient(); err != nil {
		return nil, err
	}

	f, err := readFigures(ctx, pool)
	if err != nil {
		return nil, err
	}
	rss, err := peakRSSMB()
	if err != nil {
		return nil, fmt.Errorf("read peak RSS: %w", err)
	}

	var drain, startup float64
	if !f.firstDone.IsZero() {
		drain = f.lastFloodDone.Sub(f.firstDone).Seconds()
		startup = f.firstDone.Sub(start).Seconds()
	}
	res = &result{
		Bench:           "river",
		Flood:           cfg.flood,
		Slots:           cfg.slots,
		DrainS:          round(drain, 3),
		LightJobs:       len(f.lightWaitsMS),
		PeakRSSMB:       round(rss, 1),
		Drained:         drained,
		FloodCompleted:  f.floodCompleted,
		Completed:       f.completed,
		StartupS:        round(startup, 3),
		LightRate:       cfg.lightRate,
		LightInserted:   f.lightInserted,
		LightUnstarted:  f.lightPending,
		FetchCooldownMS: float64(cmp.Or(cfg.fetchCooldown, river.FetchCooldownDefault)) / float64(time.Millisecond),
		PoolSize:        cfg.poolSize,
		RiverVersion:    riverVersion(),
	}
	if drain > 0 {
		// completed timestamps bound completed-1 intervals.
		res.TasksPerS = round(float64(f.completed-1)/drain, 1)
	}
	if len(f.lightWaitsMS) > 0 {
		res.LightWaitP50MS = round(percentile(f.lightWaitsMS, 50), 1)
		res.LightWaitP99MS = round(percentile(f.lightWaitsMS, 99), 1)
		res.LightWaitMaxMS = round(percentile(f.lightWaitsMS, 100), 1)
	}
	logf("drain %.1fs, %.0f jobs/s, %d light jobs: wait p50 %.0f ms, p99 %.0f ms, max %.0f ms; peak RSS %.1f MB",
		res.DrainS, res.TasksPerS, res.LightJobs, res.LightWaitP50MS, res.LightWaitP99MS, res.LightWaitMaxMS, res.PeakRSSMB)
	if !drained {
		return res, fmt.Errorf("flood not drained within -max-duration %s: %d of %d flood jobs completed", cfg.maxDuration, f.floodCompleted, cfg.flood)
	}
	return res, nil
}

// insertFlood loads the heavy tenant's backlog with COPY (InsertManyFast), in
// chunks so memory stays flat and progress can be shown.
func insertFlood(ctx context.Context, client *river.Client[pgxTx], total int, logf func(string, ...any)) error {
	const chunk = 10_000
	params := make([]river.InsertManyParams, 0, chunk)
	began := time.Now()
	for done := 0; done < total; {
		n := min(chunk, total-done)
		params = params[:0]
		for range n {
			params = append(params, river.InsertManyParams{Args: FloodArgs{Tenant: "flood"}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert flood jobs %d..%d: %w", done, done+n, err)
		}
		done += n
		if done%50_000 == 0 || done == total {
			logf("inserted %d/%d flood jobs (%.1fs)", done, total, time.Since(began).Seconds())
		}
	}
	return nil
}

// waitDrained returns true once every flood job is completed in the database,
// or false when -max-duration passes first.
func waitDrained(ctx context.Context, pool pgxPool, cfg config, start time.Time,
	worked, lightSent *atomic.Int64, lightErr <-chan error, logf func(string, ...any),
) (bool, error) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	deadline := start.Add(cfg.maxDuration)
	lastLog, lastWorked := start, int64(0)
	for {
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("interrupted: %w", context.Cause(ctx))
		case err := <-lightErr:
			return false, err
		case now := <-tick.C:
			w := worked.Load()
			if now.Sub(lastLog) >= 5*time.Second {
				rate := float64(w-lastWorked) / now.Sub(lastLog).Seconds()
				logf("t=%3.0fs flood worked %d/%d (%.0f jobs/s), light jobs inserted %d",
					now.Sub(start).Seconds(), w, cfg.flood, rate, lightSent.Load())
				lastLog, lastWorked = now, w
			}
			if w >= int64(cfg.flood) {
				// Work has returned for every flood job; completion is
				// written in batches, so confirm against the table.
				var left int64
				err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND state <> 'completed'`, floodKind).Scan(&left)
				if err != nil {
					if ctx.Err() != nil {
						continue
					}
					return false, fmt.Errorf("count undrained flood jobs: %w", err)
				}
				if left == 0 {
					logf("flood drained after %.1fs", time.Since(start).Seconds())
					return true, nil
				}
			}
			if now.After(deadline) {
				logf("gave up after %s with %d/%d flood jobs worked", cfg.maxDuration, w, cfg.flood)
				return false, nil
			}
		}
	}
}

// waitLightDone waits (at most 30 s) until every light job has completed.
func waitLightDone(ctx context.Context, pool pgxPool, logf func(string, ...any)) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int64
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND state <> 'completed'`, lightKind).Scan(&left)
		if err != nil {
			return fmt.Errorf("count unfinished light jobs: %w", err)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			logf("%d light jobs still unfinished 30s after the flood drained", left)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// riverVersion reports the River module version linked into this binary.
func riverVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range bi.Deps {
		if dep.Path == "github.com/riverqueue/river" {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "unknown"
}
