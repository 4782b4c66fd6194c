package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/claim"
)

// ClaimConfig describes a claim benchmark run: every (backlog, keys) point
// gets a fresh database; every claimer count is measured on it.
type ClaimConfig struct {
	ServerURL string  // any database on the server; a fresh one is created beside it
	Backlogs  []int   // pending rows
	Keys      []int   // light keys (the heavy key comes on top)
	Claimers  []int   // concurrent claim loops
	Claims    int     // measured claims per mode and claimer count (>= 2000 recommended)
	Rounds    int     // turns the two modes take at each point (4); Claims are split over them
	HeavyPct  float64 // share of the backlog in the one heavy key (0.9)
	AgingSecs int     // > 0: claims (and picks) with priority ageing
	Out       io.Writer
	Log       io.Writer // progress, may be nil
}

// ClaimPoint is one configuration's result: latencies in milliseconds.
type ClaimPoint struct {
	Bench           string  `json:"bench"`
	Backlog         int     `json:"backlog"`
	Keys            int     `json:"keys"`
	AgingSecs       int     `json:"aging_secs,omitempty"`
	Claimers        int     `json:"claimers"`
	Claims          int     `json:"claims"`
	FairP50         float64 `json:"fair_p50_ms"`
	FairP99         float64 `json:"fair_p99_ms"`
	OrdinaryP50     float64 `json:"ordinary_p50_ms"`
	OrdinaryP99     float64 `json:"ordinary_p99_ms"`
	RatioP50        float64 `json:"ratio_p50"`
	FairPickP50     float64 `json:"fair_pick_p50_ms"`
	FairPickP99     float64 `json:"fair_pick_p99_ms"`
	OrdinaryPickP50 float64 `json:"ordinary_pick_p50_ms"`
	OrdinaryPickP99 float64 `json:"ordinary_pick_p99_ms"`
	FairPerSec      float64 `json:"fair_claims_per_s"`
	OrdinaryPerSec  float64 `json:"ordinary_claims_per_s"`
}

// Skip reports why a (backlog, keys) point is left out, or "".
func Skip(backlog, keys int, heavy float64) string {
	light := math.Round(float64(backlog)*(1-heavy)*1e6) / 1e6 / float64(keys)
	if light < 10 {
		return fmt.Sprintf("%.1f rows per light key (< 10)", light)
	}
	return ""
}

// RunClaim runs the benchmark and writes one JSON line per configuration
// to cfg.Out, then a table. It returns the points measured.
func RunClaim(ctx context.Context, cfg ClaimConfig) ([]ClaimPoint, error) {
	if cfg.Claims <= 0 {
		cfg.Claims = 2000
	}
	if cfg.HeavyPct <= 0 || cfg.HeavyPct >= 1 {
		cfg.HeavyPct = 0.9
	}
	if len(cfg.Claimers) == 0 {
		cfg.Claimers = []int{1, 4, 16}
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 4
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var points []ClaimPoint
	enc := json.NewEncoder(cfg.Out)
	for _, n := range cfg.Backlogs {
		for _, k := range cfg.Keys {
			if why := Skip(n, k, cfg.HeavyPct); why != "" {
				fmt.Fprintf(cfg.Log, "skip backlog %d keys %d: %s\n", n, k, why)
				continue
			}
			ps, err := runPoint(ctx, cfg, n, k)
			if err != nil {
				return points, fmt.Errorf("backlog %d keys %d: %w", n, k, err)
			}
			for _, p := range ps {
				if err := enc.Encode(p); err != nil {
					return points, err
				}
			}
			points = append(points, ps...)
		}
	}
	WriteClaimTable(cfg.Out, points)
	return points, nil
}

// WriteClaimTable prints the points as a readable table.
func WriteClaimTable(w io.Writer, points []ClaimPoint) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backlog\tkeys\tclaimers\tfair p50\tfair p99\tordinary p50\tordinary p99\tratio p50\tfair pick p50\tordinary pick p50\tfair/s\tordinary/s\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%.3f\t%.3f\t%.0f\t%.0f\t\n",
			p.Backlog, p.Keys, p.Claimers, p.FairP50, p.FairP99, p.OrdinaryP50, p.OrdinaryP99, p.RatioP50,
			p.FairPickP50, p.OrdinaryPickP50, p.FairPerSec, p.OrdinaryPerSec)
	}
	_ = tw.Flush()
}

func randomName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "harvest_bench_" + hex.EncodeToString(b[:])
}

func withDatabase(raw, db string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("bench: %q is not a postgres:// URL", raw)
	}
	u.Path = "/" + db
	return u.String(), nil
}

func adminExec(ctx context.Context, serverURL, sql string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

func runPoint(ctx context.Context, cfg ClaimConfig, backlog, keys int) (_ []ClaimPoint, err error) {
	name := randomName()
	if err := adminExec(ctx, cfg.ServerURL, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		derr := adminExec(context.WithoutCancel(ctx), cfg.ServerURL, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		err = errors.Join(err, derr)
	}()
	dbURL, err := withDatabase(cfg.ServerURL, name)
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(slices.Max(cfg.Claimers) + 1)
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := schema.Migrate(ctx, db); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := fill(ctx, db, backlog, keys, cfg.HeavyPct); err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	fmt.Fprintf(cfg.Log, "backlog %d keys %d: filled in %v\n", backlog, keys, time.Since(start).Round(time.Millisecond))

	// Let the fill's checkpoint happen now rather than during a
	// measurement, and warm caches and plans with claims that are given
	// back before measuring.
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	for _, fair := range []bool{true, false} {
		if _, _, err := measureClaims(ctx, db, fair, cfg.AgingSecs, 1, min(200, cfg.Claims)); err != nil {
			return nil, err
		}
		if err := reset(ctx, db); err != nil {
			return nil, err
		}
	}

	var out []ClaimPoint
	for _, c := range cfg.Claimers {
		per := max(1, cfg.Claims/cfg.Rounds)
		p := ClaimPoint{Bench: "claim", Backlog: backlog, Keys: keys, Claimers: c, Claims: per * cfg.Rounds, AgingSecs: cfg.AgingSecs}
		// The two modes take turns, fair first in odd rounds and ordinary
		// first in even ones, so that a change of the machine's speed
		// during the point weighs on both alike.
		lat := map[bool][]time.Duration{}
		took := map[bool]time.Duration{}
		for r := range cfg.Rounds {
			for _, fair := range []bool{r%2 == 0, r%2 == 1} {
				l, d, err := measureClaims(ctx, db, fair, cfg.AgingSecs, c, per)
				if err != nil {
					return nil, err
				}
				lat[fair] = append(lat[fair], l...)
				took[fair] += d
				if err := reset(ctx, db); err != nil {
					return nil, err
				}
			}
		}
		for _, fair := range []bool{true, false} {
			// The pick alone is measured without ageing only: with ageing
			// the claim's pick is spread over several statements.
			var pick []time.Duration
			if cfg.AgingSecs == 0 {
				var err error
				if pick, err = measurePicks(ctx, db, fair, cfg.Claims); err != nil {
					return nil, err
				}
			}
			perSec := float64(len(lat[fair])) / took[fair].Seconds()
			if fair {
				p.FairP50, p.FairP99, p.FairPerSec = pct(lat[fair], 50), pct(lat[fair], 99), float64(int(perSec+0.5))
				p.FairPickP50, p.FairPickP99 = pct(pick, 50), pct(pick, 99)
			} else {
				p.OrdinaryP50, p.OrdinaryP99, p.OrdinaryPerSec = pct(lat[fair], 50), pct(lat[fair], 99), float64(int(perSec+0.5))
				p.OrdinaryPickP50, p.OrdinaryPickP99 = pct(pick, 50), pct(pick, 99)
			}
		}
		if p.OrdinaryP50 > 0 {
			p.RatioP50 = round3(p.FairP50 / p.OrdinaryP50)
		}
		fmt.Fprintf(cfg.Log, "backlog %d keys %d claimers %d: fair p50 %.3f ms, ordinary p50 %.3f ms\n",
			backlog, keys, c, p.FairP50, p.OrdinaryP50)
		out = append(out, p)
	}
	return out, nil
}

// fill writes the skewed backlog: one run per task; one heavy key holds
// heavy of the rows, the rest go round the light keys, interleaved with the
// heavy rows (every tenth row is light at 90%). Due times follow ids. The
// arrival trigger is off during the bulk insert and the key heads are
// rebuilt by one repair afterwards.
func fill(ctx context.Context, db *pgxpool.Pool, backlog, keys int, heavy float64) error {
	every := 1 / (1 - heavy)
	stmts := []string{
		`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`,
		fmt.Sprintf(`INSERT INTO runs (tenant, id, name, queue, request_hash, status, notify)
			SELECT 'bench', g::text, 'bench', 'bench', '\x00', 'queued', false FROM generate_series(1, %d) g`, backlog),
		fmt.Sprintf(`INSERT INTO tasks (run_pk, queue, fairness_key, state, due_at)
			SELECT r.pk, 'bench',
			       CASE WHEN mod(r.pk - 1, %[2]d) = 0 THEN 'light-' || mod((r.pk - 1) / %[2]d, %[1]d) ELSE 'heavy' END,
			       'pending', timestamptz '2026-01-01 00:00:00+00' + r.pk * interval '1 millisecond'
			FROM runs r ORDER BY r.pk`, keys, int(every+0.5)),
		`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`,
		`SELECT harvest_fair_repair('bench')`,
		`VACUUM ANALYZE runs`,
		`VACUUM ANALYZE tasks`,
		`VACUUM ANALYZE fair_state`,
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.60s: %w", s, err)
		}
	}
	return nil
}

// reset gives back the claimed rows and forgets the fairness state, so
// every configuration starts from the same backlog.
func reset(ctx context.Context, db *pgxpool.Pool) error {
	for _, s := range []string{
		`UPDATE tasks SET state = 'pending', attempt = 0, lease_token = NULL, lease_expires_at = NULL,
		        claimed_by = NULL, claimed_at = NULL WHERE state = 'running'`,
		`UPDATE runs SET status = 'queued', attempts = 0, claimed_at = NULL WHERE status = 'running'`,
		`UPDATE fair_state SET pass = NULL, last_start = NULL, charged_at = NULL, in_debt = false
		 WHERE charged_at IS NOT NULL`,
		`VACUUM ANALYZE tasks`,
		`VACUUM fair_state`,
	} {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("reset: %w", err)
		}
	}
	return nil
}

// measureClaims runs n claims over c loops and returns each claim's
// latency (one statement in autocommit, so pick, rechecks, lease, charge
// and commit) and the time they took together.
func measureClaims(ctx context.Context, db *pgxpool.Pool, fair bool, aging, c, n int) ([]time.Duration, time.Duration, error) {
	var (
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, n)
		left = n
		errs []error
		wg   sync.WaitGroup
	)
	// The loops share one Claimer, as the claim loops of a worker do: fair
	// claims waiting at the same time go out as one statement.
	claimer := claim.NewClaimer(db)
	begin := time.Now()
	for range c {
		wg.Go(func() {
			req := claim.Request{Queue: "bench", Worker: "bench", Fair: fair, AgingSecs: aging}
			for {
				mu.Lock()
				if left == 0 || len(errs) > 0 {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				t := time.Now()
				r, err := claimer.Claim(ctx, req)
				d := time.Since(t)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case !r.OK:
					errs = append(errs, fmt.Errorf("claim came back empty (%s)", r.Empty))
				default:
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	if len(errs) > 0 {
		return nil, 0, errs[0]
	}
	return lat, elapsed, nil
}

// The pick alone, read-only: the statements the claim uses to choose its
// row, without locks, lease or charge.
const (
	pickFair = `
		WITH v AS (SELECT harvest_clock($1) AS v),
		a AS (SELECT key, head_prio, head_cont, head_due, head_id, 0::float8 AS lag FROM fair_state
		      WHERE queue = $1 AND head_id IS NOT NULL AND NOT in_debt
		      ORDER BY head_prio DESC, head_cont DESC, head_due, head_id LIMIT 1),
		b AS (SELECT key, head_prio, head_cont, head_due, head_id, greatest(pass, v.v) - v.v AS lag FROM fair_state, v
		      WHERE queue = $1 AND head_id IS NOT NULL AND in_debt
		      ORDER BY head_prio DESC, pass, head_cont DESC, head_due, head_id LIMIT 1),
		k AS (SELECT * FROM (SELECT * FROM a UNION ALL SELECT * FROM b) u
		      ORDER BY -head_prio, lag, NOT head_cont, head_due, head_id LIMIT 1)
		SELECT x.id FROM k CROSS JOIN LATERAL (
			SELECT id FROM tasks x WHERE x.queue = $1 AND x.fairness_key = k.key AND x.state = 'pending'
			ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id LIMIT 1) x`
	pickOrdinary = `
		SELECT id FROM tasks WHERE queue = $1 AND state = 'pending' AND due_at <= now()
		ORDER BY priority DESC, continuation DESC, due_at, id LIMIT 1`
)

func measurePicks(ctx context.Context, db *pgxpool.Pool, fair bool, n int) ([]time.Duration, error) {
	q := pickOrdinary
	if fair {
		q = pickFair
	}
	lat := make([]time.Duration, 0, n)
	for range n {
		var id int64
		t := time.Now()
		if err := db.QueryRow(ctx, q, "bench").Scan(&id); err != nil {
			return nil, fmt.Errorf("pick: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	return lat, nil
}

func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return round3(float64(s[i]) / float64(time.Millisecond))
}

func round3(f float64) float64 {
	return float64(int64(f*1000+0.5)) / 1000
}
