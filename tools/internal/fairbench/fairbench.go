package fairbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/migrate"
	"github.com/harvest-run/harvest/tools/internal/fleetbench"
)

const queue = "fair"

// Tenant is one tenant of a scenario: its keys (all under the tenant's
// name), how long each of its tasks holds a worker, and its backlog.
type Tenant struct {
	Name    string
	Keys    int
	Hold    time.Duration
	Backlog int
}

// Scenario is one comparison: the same tenants with a mode off and on.
type Scenario struct {
	Name string
	// TwoLevel or Runtime is the mode compared.
	TwoLevel, Runtime bool
	Tenants           []Tenant
}

// Config is one run of the benchmark.
type Config struct {
	ServerURL string
	Scenarios []Scenario
	// Workers x Slots is the fleet: each worker claims up to its free
	// slots in one statement.
	Workers, Slots int
	Warmup, Window time.Duration
	Out, Log       io.Writer
}

// Result is one scenario with one setting of its mode.
type Result struct {
	Scenario string
	ModeOn   bool
	// ClaimShare and TimeShare are each tenant's share of the claims and
	// of the worker time in the window.
	ClaimShare map[string]float64
	TimeShare  map[string]float64
	ClaimsPerS float64
	// RanDry names the tenants whose backlog ran out before the end:
	// raise their Backlog.
	RanDry []string
	// BilledShare (runtime on) is each tenant's share of the worker time
	// as the database billed it: claim to the end of the attempt on the
	// database clock, for attempts that ended in the window.
	BilledShare map[string]float64
	// Series is each tenant's share of the worker time per 10 s bucket.
	Series map[string][]float64
}

// Scenarios are the two of the issue: a tenant with 100 keys against one
// with a single key (two-level), and 2 s tasks against 20 ms ones
// (runtime).
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "keys", TwoLevel: true, Tenants: []Tenant{
			{Name: "many", Keys: 100, Hold: time.Millisecond, Backlog: 400000},
			{Name: "one", Keys: 1, Hold: time.Millisecond, Backlog: 150000},
		}},
		{Name: "runtime", Runtime: true, Tenants: []Tenant{
			{Name: "slow", Keys: 1, Hold: 2 * time.Second, Backlog: 20000},
			{Name: "fast", Keys: 1, Hold: 20 * time.Millisecond, Backlog: 200000},
		}},
	}
}

// Run runs every scenario with its mode off, then on.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	var out []Result
	for _, sc := range cfg.Scenarios {
		for _, on := range []bool{false, true} {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			r, err := runOne(ctx, cfg, sc, on)
			if err != nil {
				return out, fmt.Errorf("fairbench: %s (mode on %v): %w", sc.Name, on, err)
			}
			out = append(out, r)
			if cfg.Out != nil {
				printResult(cfg.Out, sc, r)
			}
		}
	}
	return out, nil
}

func logf(cfg Config, format string, args ...any) {
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, "fairbench: "+format+"\n", args...)
	}
}

// attempt is one claim the fleet took and how long it held its slot.
type attempt struct {
	tenant     string
	start, end time.Time
}

func runOne(ctx context.Context, cfg Config, sc Scenario, on bool) (Result, error) {
	dbURL, drop, err := fleetbench.FreshDatabase(ctx, cfg.ServerURL, "harvest_fairbench_")
	if err != nil {
		return Result{}, err
	}
	defer func() {
		if err := drop(); err != nil {
			logf(cfg, "drop database: %v", err)
		}
	}()
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return Result{}, err
	}
	pcfg.MaxConns = int32(cfg.Workers*2 + 4)
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return Result{}, err
	}
	defer db.Close()
	if err := migrate.Up(ctx, db); err != nil {
		return Result{}, err
	}
	hold := map[string]time.Duration{}
	for _, t := range sc.Tenants {
		hold[t.Name] = t.Hold
		if err := fill(ctx, db, t); err != nil {
			return Result{}, err
		}
	}
	// Every settlement row the database writes (the claims fold them away
	// as they go): the worker time as the database billed it.
	if _, err := db.Exec(ctx, `CREATE TABLE bench_held_log (key text, secs double precision, at timestamptz);
		CREATE FUNCTION bench_held_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO bench_held_log VALUES (NEW.key, NEW.secs, clock_timestamp()); RETURN NULL; END $$;
		CREATE TRIGGER bench_held_log AFTER INSERT ON fair_held FOR EACH ROW EXECUTE FUNCTION bench_held_log();`); err != nil {
		return Result{}, err
	}
	if on {
		if _, err := db.Exec(ctx, `SELECT harvest_queue_fairness_set($1, $2, $3, 'bench')`,
			queue, sc.TwoLevel, map[bool]string{true: "runtime", false: "claims"}[sc.Runtime]); err != nil {
			return Result{}, err
		}
	}
	logf(cfg, "%s, mode on %v: %d workers x %d slots for %s + %s", sc.Name, on, cfg.Workers, cfg.Slots, cfg.Warmup, cfg.Window)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	from, to := t0.Add(cfg.Warmup), t0.Add(cfg.Warmup+cfg.Window)
	var (
		mu       sync.Mutex
		attempts []attempt
		wg       sync.WaitGroup
		errOnce  error
	)
	fail := func(err error) {
		mu.Lock()
		if errOnce == nil && !errors.Is(err, context.Canceled) {
			errOnce = err
		}
		mu.Unlock()
		cancel()
	}
	for w := range cfg.Workers {
		wg.Go(func() {
			free := make(chan struct{}, cfg.Slots)
			for range cfg.Slots {
				free <- struct{}{}
			}
			var tasks sync.WaitGroup
			defer tasks.Wait()
			req := claim.Request{Queue: queue, Worker: fmt.Sprintf("w%d", w), Fair: true, Lease: time.Minute}
			for runCtx.Err() == nil && time.Now().Before(to) {
				// Wait for a free slot, then take every free one.
				select {
				case <-runCtx.Done():
					return
				case <-free:
				}
				n := 1
				for more := true; more; {
					select {
					case <-free:
						n++
					default:
						more = false
					}
				}
				rs, err := claim.ClaimBatch(runCtx, db, req, n)
				claimed := time.Now()
				if err != nil {
					fail(err)
					return
				}
				took := 0
				for _, r := range rs {
					if !r.OK {
						continue
					}
					took++
					tenant, _, _ := strings.Cut(r.Task.Key, "/")
					task := r.Task
					tasks.Go(func() {
						// The slot is held from the claim to the
						// completion's commit, as the database bills it
						// in a queue charged by runtime.
						select {
						case <-runCtx.Done():
							return
						case <-time.After(hold[tenant]):
						}
						if err := claim.Complete(runCtx, db, task.ID, task.LeaseToken, nil); err != nil {
							fail(err)
							return
						}
						start, end := claimed, time.Now()
						mu.Lock()
						attempts = append(attempts, attempt{tenant: tenant, start: start, end: end})
						mu.Unlock()
						free <- struct{}{}
					})
				}
				for range n - took {
					free <- struct{}{}
				}
				if took == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if errOnce != nil {
		return Result{}, errOnce
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	r := measure(sc, on, attempts, from, to)
	// A tenant whose backlog ran out is no longer competing: its share
	// says nothing about the mode.
	for _, t := range sc.Tenants {
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE queue = $1 AND state = 'pending'
			AND split_part(fairness_key, '/', 1) = $2`, queue, t.Name).Scan(&left); err != nil {
			return Result{}, err
		}
		if left == 0 {
			r.RanDry = append(r.RanDry, t.Name)
		}
	}
	if sc.Runtime && on {
		type billed struct {
			Tenant string  `db:"tenant"`
			Secs   float64 `db:"secs"`
		}
		got, err := pgrow.All[billed](ctx, db, `SELECT split_part(key, '/', 1) AS tenant, sum(secs) AS secs
			FROM bench_held_log WHERE at >= $1 AND at < $2 GROUP BY 1`, from, to)
		if err != nil {
			return Result{}, err
		}
		r.BilledShare = map[string]float64{}
		var all float64
		for _, b := range got {
			r.BilledShare[b.Tenant] = b.Secs
			all += b.Secs
		}
		for t := range r.BilledShare {
			r.BilledShare[t] /= all
		}
	}
	return r, nil
}

// overlap is how much of [s, e] lies inside [from, to].
func overlap(s, e, from, to time.Time) time.Duration {
	if s.Before(from) {
		s = from
	}
	if e.After(to) {
		e = to
	}
	if e.Before(s) {
		return 0
	}
	return e.Sub(s)
}

const bucket = 10 * time.Second

func measure(sc Scenario, on bool, attempts []attempt, from, to time.Time) Result {
	r := Result{Scenario: sc.Name, ModeOn: on, ClaimShare: map[string]float64{}, TimeShare: map[string]float64{},
		Series: map[string][]float64{}}
	claims := map[string]int{}
	held := map[string]time.Duration{}
	nb := int((to.Sub(from) + bucket - 1) / bucket)
	per := make([]map[string]time.Duration, nb)
	for i := range per {
		per[i] = map[string]time.Duration{}
	}
	total := 0
	for _, a := range attempts {
		if !a.start.Before(from) && a.start.Before(to) {
			claims[a.tenant]++
			total++
		}
		held[a.tenant] += overlap(a.start, a.end, from, to)
		for i := range per {
			bs := from.Add(time.Duration(i) * bucket)
			per[i][a.tenant] += overlap(a.start, a.end, bs, bs.Add(bucket))
		}
	}
	var all time.Duration
	for _, d := range held {
		all += d
	}
	for _, t := range sc.Tenants {
		if total > 0 {
			r.ClaimShare[t.Name] = float64(claims[t.Name]) / float64(total)
		}
		if all > 0 {
			r.TimeShare[t.Name] = float64(held[t.Name]) / float64(all)
		}
		for i := range per {
			var sum time.Duration
			for _, d := range per[i] {
				sum += d
			}
			share := 0.0
			if sum > 0 {
				share = float64(per[i][t.Name]) / float64(sum)
			}
			r.Series[t.Name] = append(r.Series[t.Name], share)
		}
	}
	r.ClaimsPerS = float64(total) / to.Sub(from).Seconds()
	return r
}

func printResult(w io.Writer, sc Scenario, r Result) {
	mode := "two_level"
	if sc.Runtime {
		mode = "charge=runtime"
	}
	state := "off"
	if r.ModeOn {
		state = "on"
	}
	fmt.Fprintf(w, "%s, %s %s: %.0f claims/s\n", sc.Name, mode, state, r.ClaimsPerS)
	if len(r.RanDry) > 0 {
		fmt.Fprintf(w, "  WARNING: the backlog of %v ran out during the run: its shares do not measure the mode\n", r.RanDry)
	}
	for _, t := range sc.Tenants {
		billed := ""
		if r.BilledShare != nil {
			billed = fmt.Sprintf(", %5.1f%% as billed", 100*r.BilledShare[t.Name])
		}
		fmt.Fprintf(w, "  %-6s %3d keys, %8s a task: %5.1f%% of claims, %5.1f%% of worker time%s\n",
			t.Name, t.Keys, t.Hold, 100*r.ClaimShare[t.Name], 100*r.TimeShare[t.Name], billed)
	}
}

// fill inserts a tenant's backlog, spread over its keys in turn, with the
// arrival trigger off and the heads rebuilt once, as the fleet bench does.
func fill(ctx context.Context, db *pgxpool.Pool, t Tenant) error {
	for _, s := range []string{
		`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`,
		fmt.Sprintf(`INSERT INTO runs (tenant, id, name, queue, request_hash, status, notify)
			SELECT '%[1]s', '%[1]s-' || g, 'echo', '%[2]s', '\x00', 'queued', false FROM generate_series(1, %[3]d) g`,
			t.Name, queue, t.Backlog),
		fmt.Sprintf(`INSERT INTO tasks (run_pk, queue, fairness_key, state)
			SELECT pk, '%[2]s', CASE WHEN %[3]d = 1 THEN '%[1]s' ELSE '%[1]s/k' || (pk %% %[3]d) END, 'pending'
			FROM runs WHERE tenant = '%[1]s' ORDER BY pk`, t.Name, queue, t.Keys),
		`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`,
		fmt.Sprintf(`SELECT harvest_fair_repair('%s')`, queue),
		`VACUUM ANALYZE tasks`,
		`VACUUM ANALYZE fair_state`,
	} {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("fill %s: %w", t.Name, err)
		}
	}
	return nil
}
