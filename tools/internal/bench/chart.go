package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/claim"
)

// ChartConfig describes `harvest-bench claim-chart`: claim latency against
// the backlog for the fair claim, the ordinary claim and the full-scan
// baseline, drawn as an SVG chart.
type ChartConfig struct {
	ServerURL  string
	Backlogs   []int   // pending rows, one fresh database each (10k, 100k, 1M)
	Keys       int     // light keys besides the heavy one (100)
	HeavyPct   float64 // share of the heavy key (0.9)
	Claims     int     // measured fair and ordinary claims per point (500)
	ScanClaims int     // measured full-scan claims per point (20): each sorts the whole backlog
	Path       string  // SVG file ("" : no chart)
	Out        io.Writer
	Log        io.Writer
}

// ChartPoint is one backlog's figures, in milliseconds.
type ChartPoint struct {
	Bench        string  `json:"bench"`
	Backlog      int     `json:"backlog"`
	Keys         int     `json:"keys"`
	FairP50      float64 `json:"fair_p50_ms"`
	OrdinaryP50  float64 `json:"ordinary_p50_ms"`
	FullScanP50  float64 `json:"full_scan_p50_ms"`
	FairP99      float64 `json:"fair_p99_ms"`
	OrdinaryP99  float64 `json:"ordinary_p99_ms"`
	FullScanP99  float64 `json:"full_scan_p99_ms"`
	FullScanRuns int     `json:"full_scan_claims"`
}

// fullScanPick is the spec's shape of the fair pick, kept here only as the
// baseline to beat: every pending row of the queue joined to its key's
// state and sorted by (priority, lag, continuation, due time, id). It reads
// without locks so that the planner can keep only the best row (a top-N
// sort; with FOR UPDATE it would sort every row); the claim by id then locks
// and leases that row. Its cost still grows with the backlog.
const fullScanPick = `
	SELECT x.id FROM tasks x
	LEFT JOIN fair_state f ON f.queue = x.queue AND f.key = x.fairness_key AND f.charged_at IS NOT NULL
	CROSS JOIN (SELECT harvest_clock($1) AS v) c
	WHERE x.queue = $1 AND x.state = 'pending'
	ORDER BY x.priority DESC,
	         CASE WHEN f.pass IS NULL THEN 0 ELSE greatest(f.pass, c.v) - c.v END,
	         x.continuation DESC, x.due_at, x.id
	LIMIT 1`

// RunClaimChart measures every backlog and writes JSON lines, a table and
// the chart.
func RunClaimChart(ctx context.Context, cfg ChartConfig) ([]ChartPoint, error) {
	if cfg.Keys <= 0 {
		cfg.Keys = 100
	}
	if cfg.HeavyPct <= 0 || cfg.HeavyPct >= 1 {
		cfg.HeavyPct = 0.9
	}
	if cfg.Claims <= 0 {
		cfg.Claims = 500
	}
	if cfg.ScanClaims <= 0 {
		cfg.ScanClaims = 20
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	enc := json.NewEncoder(cfg.Out)
	var points []ChartPoint
	for _, n := range cfg.Backlogs {
		p, err := chartPoint(ctx, cfg, n)
		if err != nil {
			return points, fmt.Errorf("backlog %d: %w", n, err)
		}
		if err := enc.Encode(p); err != nil {
			return points, err
		}
		points = append(points, p)
	}
	tw := tabwriter.NewWriter(cfg.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backlog\tkeys\tfair p50 ms\tordinary p50 ms\tfull scan p50 ms\tfair p99 ms\tordinary p99 ms\tfull scan p99 ms\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%.3f\t%.1f\t%.3f\t%.3f\t%.1f\t\n", p.Backlog, p.Keys, p.FairP50, p.OrdinaryP50,
			p.FullScanP50, p.FairP99, p.OrdinaryP99, p.FullScanP99)
	}
	_ = tw.Flush()
	if cfg.Path != "" {
		if err := ClaimChart(cfg.Path, points); err != nil {
			return points, err
		}
		fmt.Fprintf(cfg.Log, "wrote %s\n", cfg.Path)
	}
	return points, nil
}

func chartPoint(ctx context.Context, cfg ChartConfig, backlog int) (_ ChartPoint, err error) {
	p := ChartPoint{Bench: "claim-chart", Backlog: backlog, Keys: cfg.Keys}
	name := randomName()
	if err := adminExec(ctx, cfg.ServerURL, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		return p, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		err = errors.Join(err, adminExec(context.WithoutCancel(ctx), cfg.ServerURL, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"))
	}()
	dbURL, err := withDatabase(cfg.ServerURL, name)
	if err != nil {
		return p, err
	}
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return p, err
	}
	defer db.Close()
	if _, err := schema.Migrate(ctx, db); err != nil {
		return p, err
	}
	start := time.Now()
	if err := fill(ctx, db, backlog, cfg.Keys, cfg.HeavyPct); err != nil {
		return p, fmt.Errorf("fill: %w", err)
	}
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		return p, err
	}
	fmt.Fprintf(cfg.Log, "claim-chart: backlog %d: filled in %s\n", backlog, time.Since(start).Round(time.Millisecond))
	for _, fair := range []bool{true, false} {
		if _, _, err := measureClaims(ctx, db, fair, 0, 1, min(100, cfg.Claims)); err != nil {
			return p, err
		}
		if err := reset(ctx, db); err != nil {
			return p, err
		}
		lat, _, err := measureClaims(ctx, db, fair, 0, 1, cfg.Claims)
		if err != nil {
			return p, err
		}
		if err := reset(ctx, db); err != nil {
			return p, err
		}
		if fair {
			p.FairP50, p.FairP99 = pct(lat, 50), pct(lat, 99)
		} else {
			p.OrdinaryP50, p.OrdinaryP99 = pct(lat, 50), pct(lat, 99)
		}
	}
	lat, err := measureFullScan(ctx, db, cfg.ScanClaims)
	if err != nil {
		return p, err
	}
	p.FullScanP50, p.FullScanP99, p.FullScanRuns = pct(lat, 50), pct(lat, 99), len(lat)
	fmt.Fprintf(cfg.Log, "claim-chart: backlog %d: fair p50 %.3f ms, ordinary p50 %.3f ms, full scan p50 %.1f ms\n",
		backlog, p.FairP50, p.OrdinaryP50, p.FullScanP50)
	return p, nil
}

// measureFullScan claims n tasks with the baseline: the full-scan pick,
// then the lease, rechecks and charge of the named row (claim by id), in
// one transaction, so the figure is a whole claim like the others.
func measureFullScan(ctx context.Context, db *pgxpool.Pool, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	req := claim.Request{Queue: "bench", Worker: "bench-scan", Fair: true}
	for range n {
		t := time.Now()
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		var id int64
		if err := tx.QueryRow(ctx, fullScanPick, "bench").Scan(&id); err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("full-scan pick: %w", err)
		}
		r, err := claim.ClaimByID(ctx, tx, id, req)
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, err
		}
		if !r.OK {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("full-scan claim of %d came back empty (%s)", id, r.Empty)
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t))
	}
	return lat, nil
}

// ClaimChart draws claim p50 against the backlog, both axes logarithmic.
func ClaimChart(path string, points []ChartPoint) error {
	p := plot.New()
	p.Title.Text = "Claim latency (p50) against backlog"
	p.X.Label.Text = "pending rows (90% in one key)"
	p.Y.Label.Text = "ms per claim, commit included"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	series := []struct {
		name  string
		get   func(ChartPoint) float64
		color color.Color
		dash  []vg.Length
	}{
		{"fair claim (per-key heads)", func(c ChartPoint) float64 { return c.FairP50 }, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, nil},
		{"ordinary claim (seek index)", func(c ChartPoint) float64 { return c.OrdinaryP50 }, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, []vg.Length{vg.Points(4), vg.Points(2)}},
		{"full scan (spec's shape, baseline)", func(c ChartPoint) float64 { return c.FullScanP50 }, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, nil},
	}
	for _, s := range series {
		var xys plotter.XYs
		for _, c := range points {
			if v := s.get(c); v > 0 {
				xys = append(xys, plotter.XY{X: float64(c.Backlog), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		l.Color, sc.Color = s.color, s.color
		l.Dashes = s.dash
		sc.Shape = draw.CircleGlyph{}
		p.Add(l, sc)
		p.Legend.Add(s.name, l, sc)
	}
	return p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}
