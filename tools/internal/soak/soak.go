package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/schema"
)

// SoakOptions configure Run.
type SoakOptions struct {
	Bins Binaries
	// ServerURL is a Postgres server where Run may create (and drop) two
	// throwaway shard databases.
	ServerURL string
	Duration  time.Duration
	// FaultEvery is the time between two faults (default 20s).
	FaultEvery time.Duration
	// MemoryEvery is the time between two memory samples (default 30s).
	MemoryEvery time.Duration
	// Rate is the load's starts per second (default 10).
	Rate float64
	Seed uint64
	Out  io.Writer
}

// Run starts a fleet on two fresh databases, drives a mixed load for the
// duration while injecting a random fault every FaultEvery, then drains
// the fleet and prints the invariant report and the memory of every
// process over time. It returns an error when an invariant broke.
func Run(ctx context.Context, o SoakOptions) error {
	if o.FaultEvery <= 0 {
		o.FaultEvery = 20 * time.Second
	}
	if o.MemoryEvery <= 0 {
		o.MemoryEvery = 30 * time.Second
	}
	if o.Rate <= 0 {
		o.Rate = 10
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	out := o.Out
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "%s  %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "harvest-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var urls []string
	for i := range 2 {
		u, drop, err := createDB(ctx, o.ServerURL, fmt.Sprintf("harvest_soak_%d_%d", os.Getpid(), i))
		if err != nil {
			return err
		}
		defer drop()
		urls = append(urls, u)
	}
	// A janitor tick every second: the shards grow during a soak, and each
	// tick's fairness prune holds the running counts (see
	// docs/reliability.md), so a faster janitor would throttle the fleet.
	f, err := Start(ctx, Options{Bins: o.Bins, ShardURLs: urls, Dir: dir, Logf: logf, JanitorInterval: time.Second})
	if err != nil {
		return err
	}
	defer f.Close()
	load, err := f.StartLoad(LoadOptions{Rate: o.Rate, Probe: true})
	if err != nil {
		return err
	}
	defer load.Abort()

	rnd := rand.New(rand.NewPCG(o.Seed, 0))
	logf("soak for %s, a fault every %s (seed %d); faults: %s", o.Duration, o.FaultEvery, o.Seed, FaultNames())
	type memSample struct {
		at  time.Duration
		rss map[string]int64
	}
	began := time.Now()
	var mem []memSample
	sampleMem := func() {
		mem = append(mem, memSample{time.Since(began).Round(time.Second), f.RSS()})
	}
	sampleMem()
	end := time.After(o.Duration)
	faultT := time.NewTicker(o.FaultEvery)
	defer faultT.Stop()
	memT := time.NewTicker(o.MemoryEvery)
	defer memT.Stop()
	faults := Faults()
	counts := map[string]int{}
	var faultErrs []string
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-memT.C:
			sampleMem()
			sent, acked, retries, giveups := load.Stats()
			logf("load: %d sent, %d acked, %d retries, %d given up", sent, acked, retries, giveups)
		case <-faultT.C:
			ft := faults[rnd.IntN(len(faults))]
			fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			what, err := ft.Do(fctx, f, rnd)
			cancel()
			counts[ft.Name]++
			if err != nil {
				faultErrs = append(faultErrs, fmt.Sprintf("%s: %v", ft.Name, err))
				logf("fault %q FAILED: %v", ft.Name, err)
			} else {
				logf("fault %q: %s", ft.Name, what)
			}
		}
	}
	logf("stopping the load and draining")
	load.Stop()
	sampleMem()
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- f.Drain(dctx, 8*time.Minute) }()
	var drainErr error
	progress := time.NewTicker(15 * time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case drainErr = <-drained:
			break wait
		case <-progress.C:
			logf("draining: %d unfinished runs", f.Unfinished(dctx))
		}
	}
	logf("drained (err: %v); checking", drainErr)
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer ccancel()
	rep := f.Check(cctx, load.Acked(), load.Problems())
	if drainErr != nil {
		rep.Violations = append(rep.Violations, "drain: "+drainErr.Error())
	}
	for _, e := range faultErrs {
		rep.Violations = append(rep.Violations, "fault did not go as planned: "+e)
	}

	fmt.Fprintf(out, "\n## Soak report (%s, seed %d)\n\n", o.Duration, o.Seed)
	sent, acked, retries, giveups := load.Stats()
	fmt.Fprintf(out, "load: %d starts sent, %d acknowledged, %d retries, %d given up\n", sent, acked, retries, giveups)
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprint(out, "faults:")
	for _, n := range names {
		fmt.Fprintf(out, " %s ×%d;", n, counts[n])
	}
	fmt.Fprintln(out)
	if se := load.ServerErrors(); len(se) > 0 {
		fmt.Fprintf(out, "5xx answers other than 503 (each start was sent again): %d, e.g. %s\n", len(se), se[0])
	}
	fmt.Fprint(out, rep.String())

	// Memory: one column per process that was alive at some sample.
	cols := map[string]bool{}
	for _, s := range mem {
		for n := range s.rss {
			cols[n] = true
		}
	}
	colNames := make([]string, 0, len(cols))
	for n := range cols {
		colNames = append(colNames, n)
	}
	sort.Strings(colNames)
	fmt.Fprintln(out, "\nRSS in MiB over time (- : not running):")
	tw := tabwriter.NewWriter(out, 1, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "t\t%s\t\n", strings.Join(colNames, "\t"))
	for _, s := range mem {
		row := []string{s.at.String()}
		for _, n := range colNames {
			if v, ok := s.rss[n]; ok && v > 0 {
				row = append(row, fmt.Sprintf("%.0f", float64(v)/(1<<20)))
			} else {
				row = append(row, "-")
			}
		}
		fmt.Fprintf(tw, "%s\t\n", strings.Join(row, "\t"))
	}
	_ = tw.Flush()
	if !rep.OK() {
		return fmt.Errorf("soak: %d invariant violation(s)", len(rep.Violations))
	}
	return nil
}

// createDB creates a migrated database on the server and returns its URL
// and a function that drops it.
func createDB(ctx context.Context, serverURL, name string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("soak: connect to %s: %w", serverURL, err)
	}
	defer admin.Close(context.Background())
	ident := pgx.Identifier{name}.Sanitize()
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE template0"); err != nil {
		return "", nil, fmt.Errorf("soak: create database %s: %w", name, err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	dbURL := u.String()
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(dctx, serverURL); err == nil {
			_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
			_ = c.Close(dctx)
		}
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		drop()
		return "", nil, err
	}
	defer conn.Close(context.Background())
	if _, err := schema.Migrate(ctx, conn); err != nil {
		drop()
		return "", nil, err
	}
	return dbURL, drop, nil
}
