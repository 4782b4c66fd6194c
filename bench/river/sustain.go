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
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// river-bench sustain: River's side of `harvest-bench sustain --vs-river`.
// Jobs are inserted one Insert per job from a number of goroutines at a
// rising rate, as Harvest's starts are sent, and each step is judged by
// the same rule from the rows: at least 95% of the offered jobs inserted,
// the 95th percentile of insert-to-fetch (attempted_at - created_at)
// under 1 s, and every inserted job fetched 10 s after the step.

const sustainKind = "harvest_bench_sustain"

// SustainArgs is one job of the sustained benchmark.
type SustainArgs struct {
	Step int `json:"step"`
	N    int `json:"n"`
}

// Kind names the job kind.
func (SustainArgs) Kind() string { return sustainKind }

// InsertOpts puts the job on the benchmark's queue.
func (SustainArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: benchQueue} }

type sustainWorker struct {
	river.WorkerDefaults[SustainArgs]
}

func (w *sustainWorker) Work(context.Context, *river.Job[SustainArgs]) error { return nil }

type sustainConfig struct {
	databaseURL   string
	rates         []int
	step          time.Duration
	senders       int
	slots         int
	poolSize      int
	fetchCooldown time.Duration
	keepGoing     bool
	keepDB        bool
}

// sustainStep is one step's JSON line; the fields are those of
// harvest-bench sustain's steps, then River's settings.
type sustainStep struct {
	Bench      string  `json:"bench"`
	System     string  `json:"system"`
	Rate       int     `json:"rate"`
	Seconds    float64 `json:"seconds"`
	Offered    int     `json:"offered"`
	Sent       int     `json:"sent"`
	Acked      int     `json:"acked"`
	Refused    int     `json:"refused"`
	Errors     int     `json:"errors"`
	AckedPct   float64 `json:"acked_pct"`
	AckP50     float64 `json:"ack_p50_ms"`
	AckP99     float64 `json:"ack_p99_ms"`
	Claimed    int     `json:"claimed"`
	WaitP50    float64 `json:"wait_p50_ms"`
	WaitP95    float64 `json:"wait_p95_ms"`
	WaitP99    float64 `json:"wait_p99_ms"`
	Unclaimed  int     `json:"unclaimed"`
	Holds      bool    `json:"holds"`
	Load1      float64 `json:"load1"`
	FirstError string  `json:"first_error,omitempty"`

	Slots           int     `json:"slots"`
	PoolSize        int     `json:"pool_size"`
	FetchCooldownMS float64 `json:"fetch_cooldown_ms"`
	RiverVersion    string  `json:"river_version"`
}

// sustainMain runs river-bench sustain with args and returns the exit code.
func sustainMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("river-bench sustain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := sustainConfig{databaseURL: cmp.Or(os.Getenv("HARVEST_DATABASE_URL"), defaultDatabaseURL)}
	fs.StringVar(&cfg.databaseURL, "database-url", cfg.databaseURL, "server to create the throwaway database on")
	rates := fs.String("rates", "500,1000,1500,2000,2500,3000,4000,5000", "inserts per second of the steps, rising")
	fs.DurationVar(&cfg.step, "step", 10*time.Second, "how long each rate is offered")
	fs.IntVar(&cfg.senders, "senders", 128, "goroutines inserting, one Insert per job")
	fs.IntVar(&cfg.slots, "slots", 100, "MaxWorkers of the one queue")
	fs.IntVar(&cfg.poolSize, "pool-size", 40, "pgx pool of the client and the inserts")
	fs.DurationVar(&cfg.fetchCooldown, "fetch-cooldown", time.Millisecond, "River FetchCooldown (1ms is its smallest)")
	fs.BoolVar(&cfg.keepGoing, "keep-going", false, "measure every rate instead of stopping at the first that fails")
	fs.BoolVar(&cfg.keepDB, "keep-db", false, "leave the database in place for inspection")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, s := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "river-bench sustain: -rates %q: want whole numbers above 0\n", *rates)
			return 2
		}
		cfg.rates = append(cfg.rates, n)
	}
	switch {
	case cfg.step <= 0 || cfg.senders < 1 || cfg.slots < 1 || cfg.poolSize < 2:
		fmt.Fprintln(stderr, "river-bench sustain: -step, -senders and -slots must be positive, -pool-size at least 2")
		return 2
	case cfg.fetchCooldown < river.FetchCooldownMin:
		fmt.Fprintf(stderr, "river-bench sustain: -fetch-cooldown must be at least %s\n", river.FetchCooldownMin)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runSustain(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "river-bench sustain: error: %v\n", err)
		return 1
	}
	return 0
}

func runSustain(ctx context.Context, cfg sustainConfig, stdout, logw io.Writer) (err error) {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "river-bench: "+format+"\n", args...) }
	name, err := randomDBName()
	if err != nil {
		return err
	}
	if err := createDatabase(ctx, cfg.databaseURL, name); err != nil {
		return err
	}
	defer func() {
		if cfg.keepDB {
			logf("kept database %s (-keep-db)", name)
			return
		}
		err = errors.Join(err, dropDatabase(cfg.databaseURL, name))
	}()
	pool, err := openPool(ctx, cfg.databaseURL, name, int32(cfg.poolSize))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrate(ctx, pool); err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &sustainWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:                      map[string]river.QueueConfig{benchQueue: {MaxWorkers: cfg.slots}},
		Workers:                     workers,
		Logger:                      slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		CompletedJobRetentionPeriod: -1, // the waits are read from the rows
		FetchCooldown:               cfg.fetchCooldown,
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start river client: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, client.Stop(sctx))
	}()
	logf("sustain: %d slots, fetch cooldown %s, %d inserters, pool %d", cfg.slots, cfg.fetchCooldown, cfg.senders, cfg.poolSize)
	for i, rate := range cfg.rates {
		s, err := sustainOneStep(ctx, client, pool, cfg, i, rate)
		if err != nil {
			return err
		}
		line, _ := json.Marshal(s)
		fmt.Fprintln(stdout, string(line))
		logf("sustain: %d/s: inserted %.1f%%, wait p95 %.0f ms, unfetched %d, holds %v", rate, s.AckedPct, s.WaitP95, s.Unclaimed, s.Holds)
		if !s.Holds && !cfg.keepGoing {
			break
		}
	}
	return nil
}

// sustainOneStep offers rate inserts per second for the step's time from
// the senders (job k due k/rate after the step's start; what is not sent
// by its end is not inserted), then reads the waits from river_job.
func sustainOneStep(ctx context.Context, client *river.Client[pgxTx], pool *pgxpool.Pool, cfg sustainConfig, step, rate int) (sustainStep, error) {
	s := sustainStep{Bench: "sustain", System: "river", Rate: rate, Offered: int(math.Round(float64(rate) * cfg.step.Seconds())),
		Slots: cfg.slots, PoolSize: cfg.poolSize, FetchCooldownMS: float64(cfg.fetchCooldown) / float64(time.Millisecond),
		RiverVersion: riverVersion()}
	var (
		next         atomic.Int64
		acked, errs  atomic.Int64
		sent         atomic.Int64
		first        atomic.Value
		mu           sync.Mutex
		lat          []float64
		wg           sync.WaitGroup
		start        = time.Now()
		end          = start.Add(cfg.step)
		offered      = int64(s.Offered)
		perJobPeriod = float64(time.Second) / float64(rate)
	)
	for range cfg.senders {
		wg.Go(func() {
			var mine []float64
			for ctx.Err() == nil {
				k := next.Add(1) - 1
				if k >= offered {
					break
				}
				if wait := time.Until(start.Add(time.Duration(float64(k) * perJobPeriod))); wait > 0 {
					time.Sleep(wait)
				}
				if time.Now().After(end) {
					break
				}
				sent.Add(1)
				t0 := time.Now()
				ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := client.Insert(ictx, SustainArgs{Step: step, N: int(k)}, nil)
				cancel()
				if err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				acked.Add(1)
				mine = append(mine, float64(time.Since(t0))/float64(time.Millisecond))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return s, err
	}
	s.Seconds = round(time.Since(start).Seconds(), 3)
	s.Sent, s.Acked, s.Errors = int(sent.Load()), int(acked.Load()), int(errs.Load())
	if v := first.Load(); v != nil {
		s.FirstError = v.(string)
	}
	if len(lat) > 0 {
		s.AckP50, s.AckP99 = round(percentile(lat, 50), 3), round(percentile(lat, 99), 3)
	}
	deadline := end.Add(10 * time.Second)
	for {
		var left int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND (args->>'step')::int = $2 AND attempted_at IS NULL`,
			sustainKind, step).Scan(&left)
		if err != nil {
			return s, fmt.Errorf("count unfetched jobs: %w", err)
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	rows, err := pool.Query(ctx, `SELECT extract(epoch FROM attempted_at - created_at)::float8 * 1000 FROM river_job
		WHERE kind = $1 AND (args->>'step')::int = $2`, sustainKind, step)
	if err != nil {
		return s, fmt.Errorf("read waits: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[*float64])
	if err != nil {
		return s, err
	}
	var waits []float64
	for _, ms := range all {
		if ms == nil {
			s.Unclaimed++
			continue
		}
		waits = append(waits, *ms)
	}
	slices.Sort(waits)
	s.Claimed = len(waits)
	if len(waits) > 0 {
		s.WaitP50, s.WaitP95, s.WaitP99 = round(percentile(waits, 50), 3), round(percentile(waits, 95), 3), round(percentile(waits, 99), 3)
	}
	if s.Offered > 0 {
		s.AckedPct = round(100*float64(s.Acked)/float64(s.Offered), 3)
	}
	s.Holds = s.Offered > 0 && float64(s.Acked) >= 0.95*float64(s.Offered) && s.WaitP95 < 1000 && s.Unclaimed == 0 && s.Claimed > 0
	s.Load1 = loadAvg()
	return s, nil
}

// loadAvg is the machine's one-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}
