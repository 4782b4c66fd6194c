package movebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/natsembed"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/tenantmove"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/fleetbench"
)

// Defaults of Config.
const (
	DefaultRuns     = 10_000
	DefaultClients  = 4
	DefaultBaseline = 5 * time.Second
	// shardCount is the fleet's size: the tenant goes from shard 0 to 2.
	shardCount = 3
	// lockSample is how often the old home is asked for lock waiters.
	lockSample = 10 * time.Millisecond
)

// Config describes one run of the benchmark.
type Config struct {
	// ServerURL is any database on the PostgreSQL server; three fresh
	// databases are made beside it and dropped at the end.
	ServerURL string
	// NATSURL names a NATS server; empty starts an embedded one.
	NATSURL string
	// Runs is how many unfinished runs the moved tenant has.
	Runs int
	// Batch is the move's batch (tenantmove.DefaultBatch when zero).
	Batch int
	// Clients is how many closed-loop clients flood the old home as
	// another tenant while the move runs.
	Clients int
	// Baseline is how long the flood is measured before the move.
	Baseline time.Duration
	Out, Log io.Writer
}

// Latency sums up the flood's starts over a period.
type Latency struct {
	Starts  int     `json:"starts"`
	Refused int     `json:"refused"`
	PerSec  float64 `json:"per_sec"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	MaxMS   float64 `json:"max_ms"`
}

// Result is the benchmark's outcome, printed as one JSON line.
type Result struct {
	Runs      int     `json:"runs"`
	Batch     int     `json:"batch"`
	Batches   int     `json:"batches"`
	MoveS     float64 `json:"move_s"`
	LongestMS float64 `json:"longest_step_ms"`
	// LockWaiters is how many samples found a statement on the old home
	// waiting on a lock, LockWaitMS the longest such statement had run.
	LockSamples int     `json:"lock_samples"`
	LockWaiters int     `json:"lock_waiters"`
	LockWaitMS  float64 `json:"lock_wait_max_ms"`
	Before      Latency `json:"flood_before"`
	During      Latency `json:"flood_during"`
}

// tenantOn returns a tenant name whose rendezvous home among the shards
// is shard, other than not.
func tenantOn(shard int, prefix, not string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		if name != not && shards.Home(name, shardCount) == shard {
			return name
		}
	}
}

// Run sets up three shards and a gateway, gives one tenant Runs unfinished
// runs on shard 0, floods shard 0 as another tenant, measures the flood,
// then moves the first tenant to shard 2 and measures the flood again.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Runs <= 0 {
		cfg.Runs = DefaultRuns
	}
	if cfg.Batch <= 0 {
		cfg.Batch = tenantmove.DefaultBatch
	}
	if cfg.Clients <= 0 {
		cfg.Clients = DefaultClients
	}
	if cfg.Baseline <= 0 {
		cfg.Baseline = DefaultBaseline
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "movebench: "+format+"\n", args...)
		}
	}
	var urls []string
	var pools []*pgxpool.Pool
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	for range shardCount {
		u, drop, err := fleetbench.FreshDatabase(ctx, cfg.ServerURL, "harvest_move_")
		if err != nil {
			return res, err
		}
		defer func() { err = errors.Join(err, drop()) }()
		p, err := pgxpool.New(ctx, u)
		if err != nil {
			return res, err
		}
		pools = append(pools, p)
		if _, err := schema.Migrate(ctx, p); err != nil {
			return res, err
		}
		urls = append(urls, u)
	}
	natsURL := cfg.NATSURL
	if natsURL == "" {
		ns, err := natsembed.Start(natsembed.Options{})
		if err != nil {
			return res, err
		}
		defer ns.Shutdown()
		natsURL = ns.URL()
	}
	nc, err := natsconn.Connect(natsURL, natsconn.Options{Name: "movebench", FailFast: true})
	if err != nil {
		return res, err
	}
	defer nc.Close()

	mover := tenantOn(0, "mover", "")
	flooder := tenantOn(0, "flood", mover)
	var entries []auth.FileEntry
	secrets := map[string]string{}
	for _, t := range []string{mover, flooder} {
		s, err := auth.NewSecret()
		if err != nil {
			return res, err
		}
		secrets[t] = s
		entries = append(entries, auth.FileEntry{Name: t, Tenant: t, SHA256: auth.HashSecret(s), Privileges: []string{"runs:start", "runs:read"}})
	}
	raw, err := json.Marshal(entries)
	if err != nil {
		return res, err
	}
	set, err := auth.ParseTokens(raw)
	if err != nil {
		return res, err
	}
	const maxRuns = 1 << 30
	gcfg := gateway.DefaultConfig(urls, natsURL)
	gcfg.MaxRuns = maxRuns
	gw, err := gateway.New(gateway.Options{Config: gcfg, Tokens: auth.NewStore(set), NATS: nc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return res, err
	}
	defer gw.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := gw.Server()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	newClient := func(tenant string) (*client.Client, error) {
		return client.New(client.Options{URL: "http://" + ln.Addr().String(), Token: secrets[tenant],
			HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}})
	}

	// The moved tenant's runs: no worker serves the queue, so they stay
	// unfinished.
	logf("%s: starting %d runs on shard 0", mover, cfg.Runs)
	mc, err := newClient(mover)
	if err != nil {
		return res, err
	}
	for done := 0; done < cfg.Runs; {
		n := min(1000, cfg.Runs-done)
		reqs := make([]api.StartRequest, n)
		for i := range reqs {
			reqs[i] = api.StartRequest{Name: "echo", Queue: "moved", ID: fmt.Sprintf("m-%d", done+i)}
		}
		out, err := mc.StartBatch(ctx, reqs)
		if err != nil {
			return res, fmt.Errorf("movebench: fill: %w", err)
		}
		for _, r := range out {
			if r.Error != nil {
				return res, fmt.Errorf("movebench: fill: %s", r.Error.Message)
			}
		}
		done += n
	}

	flood := newFlood(ctx, cfg.Clients, func() (*client.Client, error) { return newClient(flooder) })
	if err := flood.err(); err != nil {
		return res, err
	}
	defer flood.stop()
	logf("%s floods shard 0 with %d clients; measuring %s before the move", flooder, cfg.Clients, cfg.Baseline)
	flood.mark()
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(cfg.Baseline):
	}
	res.Before = flood.mark()

	locks := sampleLocks(ctx, pools[0])
	var steps []time.Duration
	last := time.Now()
	begin := last
	rep, err := tenantmove.Move(ctx, tenantmove.Options{
		Shards: pools, NATS: nc, Prefix: gcfg.SubjectPrefix, MaxRuns: maxRuns, Batch: cfg.Batch,
		Progress: func(s tenantmove.Step) {
			now := time.Now()
			steps = append(steps, now.Sub(last))
			last = now
		},
	}, mover, 2)
	elapsed := time.Since(begin)
	res.During = flood.mark()
	lk := locks.stop()
	if err != nil {
		return res, fmt.Errorf("movebench: move: %w", err)
	}
	var left int
	if err := pools[0].QueryRow(ctx, `SELECT count(*) FROM runs WHERE tenant = $1`, mover).Scan(&left); err != nil {
		return res, err
	}
	var there int
	if err := pools[2].QueryRow(ctx, `SELECT count(*) FROM runs WHERE tenant = $1 AND finished_at IS NULL`, mover).Scan(&there); err != nil {
		return res, err
	}
	if left != 0 || there != cfg.Runs {
		return res, fmt.Errorf("movebench: after the move shard 0 holds %d runs of %s and shard 2 %d unfinished (want 0 and %d)", left, mover, there, cfg.Runs)
	}
	res.Runs, res.Batch, res.Batches, res.MoveS = cfg.Runs, cfg.Batch, rep.Batches, elapsed.Seconds()
	res.LongestMS = ms(slices.Max(append(steps, 0)))
	res.LockSamples, res.LockWaiters, res.LockWaitMS = lk.samples, lk.waiters, ms(lk.longest)
	line, _ := json.Marshal(res)
	if cfg.Out != nil {
		fmt.Fprintln(cfg.Out, string(line))
	}
	return res, nil
}

// flood runs closed-loop starts and keeps their latencies per period.
type flood struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	lat    []time.Duration
	refuse int
	since  time.Time
	first  error
}

func newFlood(ctx context.Context, n int, mk func() (*client.Client, error)) *flood {
	ctx, cancel := context.WithCancel(ctx)
	f := &flood{cancel: cancel, since: time.Now()}
	for range n {
		c, err := mk()
		if err != nil {
			f.first = err
			break
		}
		f.wg.Go(func() {
			for ctx.Err() == nil {
				t := time.Now()
				_, err := c.Start(ctx, "echo", "flood", nil, client.StartOptions{})
				d := time.Since(t)
				f.mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						f.refuse++
					}
				} else {
					f.lat = append(f.lat, d)
				}
				f.mu.Unlock()
			}
		})
	}
	return f
}

func (f *flood) err() error { return f.first }

// mark returns the latencies since the last mark and starts a new period.
func (f *flood) mark() Latency {
	f.mu.Lock()
	lat, refused, since := f.lat, f.refuse, f.since
	f.lat, f.refuse, f.since = nil, 0, time.Now()
	f.mu.Unlock()
	slices.Sort(lat)
	l := Latency{Starts: len(lat), Refused: refused, PerSec: round(float64(len(lat)) / time.Since(since).Seconds())}
	if len(lat) > 0 {
		l.P50ms, l.P99ms, l.MaxMS = ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), ms(lat[len(lat)-1])
	}
	return l
}

func (f *flood) stop() {
	f.cancel()
	f.wg.Wait()
}

// lockSampler asks a shard for statements waiting on a lock.
type lockSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples int
	waiters int
	longest time.Duration
}

func sampleLocks(ctx context.Context, db *pgxpool.Pool) *lockSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &lockSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(lockSample)
		defer t.Stop()
		for {
			type waiters struct {
				N       int     `db:"waiters"`
				Longest float64 `db:"longest"`
			}
			w, err := pgrow.One[waiters](ctx, db, `SELECT count(*) AS waiters,
				coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)::float8 AS longest
				FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
			n, longest := w.N, w.Longest
			if err == nil {
				s.samples++
				if n > 0 {
					s.waiters++
					s.longest = max(s.longest, time.Duration(longest*float64(time.Second)))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *lockSampler) stop() *lockSampler {
	s.cancel()
	<-s.done
	return s
}

func ms(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
