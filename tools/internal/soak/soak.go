package soak

import (
	"context"
	"errors"
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
	"github.com/harvest-run/harvest/pkg/api"
)

// Defaults of SoakOptions.
const (
	DefaultFaultEvery  = 20 * time.Second
	DefaultMemoryEvery = 30 * time.Second
	DefaultRate        = 10
	// DefaultSlots is each worker's tasks at once in the soak: enough
	// that the fleet, not its slots, sets the pace.
	DefaultSlots = 100
	// DefaultWaitBound is the p95 claim wait (claimed_at - due_at over a
	// ramp step, worst shard) past which a step fails. Not the p99: a
	// fault every few seconds (a shard down for 2s, a worker killed with
	// its tasks) holds one or two tasks in a hundred back that long
	// whatever the rate.
	DefaultWaitBound = 5 * time.Second
	// soakBatch is the workers' default claim batch, for the monitor's
	// edge allowance.
	soakBatch = 50
)

// SoakOptions configure Run.
type SoakOptions struct {
	Bins Binaries
	// ServerURL is a Postgres server where Run may create (and drop) two
	// throwaway shard databases.
	ServerURL string
	Duration  time.Duration
	// FaultEvery is the time between two faults (DefaultFaultEvery).
	FaultEvery time.Duration
	// MemoryEvery is the time between two memory samples
	// (DefaultMemoryEvery).
	MemoryEvery time.Duration
	// Rate is the load's starts per second (DefaultRate), the first step's
	// with RampStep.
	Rate float64
	// RampStep, when positive, raises the rate by this much every
	// RampEvery until a step breaks a promise, its p95 claim wait passes
	// WaitBound, the load cannot send its rate, or Duration is over.
	RampStep  float64
	RampEvery time.Duration
	WaitBound time.Duration
	// WorkersPerShard and Slots size the fleet (2 and DefaultSlots).
	WorkersPerShard int
	Slots           int
	// MaxRuns is the system limit (default: twelve seconds of starts, at
	// least 1,000: a burst of the weighted pair is ten seconds' worth, so
	// a fault that holds runs back during one meets the limit; a ramp sets
	// none that it could reach).
	MaxRuns int
	Seed    uint64
	Out     io.Writer
}

func (o *SoakOptions) defaults() {
	if o.FaultEvery <= 0 {
		o.FaultEvery = DefaultFaultEvery
	}
	if o.MemoryEvery <= 0 {
		o.MemoryEvery = DefaultMemoryEvery
	}
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.RampEvery <= 0 {
		o.RampEvery = time.Minute
	}
	if o.WaitBound <= 0 {
		o.WaitBound = DefaultWaitBound
	}
	if o.WorkersPerShard <= 0 {
		o.WorkersPerShard = 2
	}
	if o.Slots <= 0 {
		o.Slots = DefaultSlots
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = max(1000, int(12*o.Rate))
		if o.RampStep > 0 {
			o.MaxRuns = 1_000_000
		}
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
}

// ErrInterrupted is returned by Run when its context ended it: the report
// then holds what was seen up to that point.
var ErrInterrupted = errors.New("soak: interrupted")

// Run starts a fleet on two fresh databases, drives the mixed load for the
// duration while injecting a random fault every FaultEvery and a monitor
// checks fairness, priority and admission, then drains the fleet and
// prints the invariant report, the monitor's findings, the memory of every
// process over time and the size of the hot tables before and after. It
// returns an error when an invariant broke. When ctx ends (Ctrl-C), at any
// phase, it stops the load, prints what it saw so far, stops every process
// and drops its databases, and returns ErrInterrupted.
func Run(ctx context.Context, o SoakOptions) (err error) {
	o.defaults()
	out := o.Out
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "%s  %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "harvest-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	urls, drop, err := createShards(ctx, o.ServerURL, "harvest_soak")
	if err != nil {
		return interrupted(ctx, err)
	}
	defer drop()
	// A janitor tick every second: the shards grow during a soak, and each
	// tick's fairness prune holds the running counts (see
	// docs/reliability.md), so a faster janitor would throttle the fleet.
	// A lease of 2s (heartbeat 500ms): a killed worker's tasks are claimed
	// again within about 3s, under the wait bound, while the heartbeats of
	// long tasks cost half of what the fault tests' 1s lease does.
	f, err := Start(ctx, Options{Bins: o.Bins, ShardURLs: urls, Dir: dir, Logf: logf, JanitorInterval: time.Second, Lease: 2 * time.Second,
		WorkersPerShard: o.WorkersPerShard, Slots: o.Slots, GatewayPool: 8, MaxRuns: o.MaxRuns})
	if err != nil {
		return interrupted(ctx, err)
	}
	defer f.Close()
	if err := f.configureMix(ctx, o.Rate); err != nil {
		return interrupted(ctx, err)
	}
	sizesBefore := f.TableSizes(ctx)
	// On a server without autovacuum (a test server, say) the soak stands
	// in for it (standInVacuum) and says so: otherwise dead rows grow for
	// the whole run and the sizes say nothing of Harvest, and the tables
	// are never analyzed. The fair claim's tables and the hot rows are
	// vacuumed by the janitor either way.
	standIn := f.AutovacuumOff(ctx)
	if standIn {
		logf("%s", standInNote)
	}
	mon := NewMonitor(f, o.WorkersPerShard*min(soakBatch, o.Slots))
	defer mon.Stop()
	load, err := f.StartLoad(LoadOptions{Rate: o.Rate, Probe: true, Mixed: true, Monitor: mon, Inflight: max(64, int(o.Rate))})
	if err != nil {
		return interrupted(ctx, err)
	}
	defer load.Abort()

	rnd := rand.New(rand.NewPCG(o.Seed, 0))
	mode := fmt.Sprintf("at %.0f starts/s", o.Rate)
	if o.RampStep > 0 {
		mode = fmt.Sprintf("from %.0f starts/s, +%.0f every %s until a step fails (p95 claim wait bound %s)", o.Rate, o.RampStep, o.RampEvery, o.WaitBound)
	}
	logf("soak for %s %s, %d workers of %d slots per shard, limit %d runs, a fault every %s (seed %d); faults: %s",
		o.Duration, mode, o.WorkersPerShard, o.Slots, o.MaxRuns, o.FaultEvery, o.Seed, FaultNames())
	began := time.Now()
	cpu := newCPUSampler(f)
	cpuFrom := cpu.snapshot()
	var mem []memSample
	var sizes []sizeSample
	sampleMem := func() {
		at := time.Since(began).Round(time.Second)
		mem = append(mem, memSample{at, f.RSS()})
		cpu.sample()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sizes = append(sizes, sizeSample{at, f.TableSizes(sctx)})
		cancel()
	}
	vacT := newStandInTicker(standIn)
	defer vacT.Stop()
	sampleMem()
	end := time.After(o.Duration)
	faultT := time.NewTicker(o.FaultEvery)
	defer faultT.Stop()
	memT := time.NewTicker(o.MemoryEvery)
	defer memT.Stop()
	rampT := time.NewTicker(o.RampEvery)
	defer rampT.Stop()
	if o.RampStep <= 0 {
		rampT.Stop()
	}
	ramp := &rampLog{f: f, load: load, mon: mon, bound: o.WaitBound, from: time.Now()}
	faults := Faults()
	counts := map[string]int{}
	var faultErrs []string
	stopped := false
loop:
	for {
		select {
		case <-ctx.Done():
			stopped = true
			break loop
		case <-end:
			break loop
		case <-vacT.C():
			vctx, cancel := context.WithTimeout(ctx, time.Minute)
			f.VacuumRunsAndTasks(vctx)
			cancel()
		case <-memT.C:
			sampleMem()
			sent, acked, retries, giveups := load.Stats()
			logf("load: %d sent, %d acked, %d retries, %d given up; %d unfinished", sent, acked, retries, giveups, f.Unfinished(ctx))
		case <-rampT.C:
			st := ramp.step(ctx)
			logf("step %.0f starts/s: %s", st.rate, st)
			if st.failed != "" {
				logf("the step failed (%s): stopping the ramp", st.failed)
				break loop
			}
			load.SetRate(load.Rate() + o.RampStep)
		case <-faultT.C:
			ft := faults[rnd.IntN(len(faults))]
			fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			what, err := ft.Do(fctx, f, rnd)
			cancel()
			counts[ft.Name]++
			if err != nil && ctx.Err() == nil {
				faultErrs = append(faultErrs, fmt.Sprintf("%s: %v", ft.Name, err))
				logf("fault %q FAILED: %v", ft.Name, err)
			} else if err == nil {
				logf("fault %q: %s", ft.Name, what)
			}
		}
	}
	ran := time.Since(began)
	cpu.sample()
	cpuTo := cpu.snapshot()
	rep := Report{ByStatus: nil}
	var drainErr error
	if !stopped {
		logf("stopping the load and draining")
		load.Stop()
		sampleMem()
		drainErr = drain(ctx, f, logf)
		stopped = ctx.Err() != nil
	}
	mon.Stop()
	if stopped {
		logf("interrupted: stopping the load; the final check is skipped, here is what was seen")
		load.Abort()
	} else {
		logf("drained (err: %v); checking", drainErr)
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Minute)
		rep = f.Check(cctx, load.Acked(), load.Problems())
		ccancel()
		if drainErr != nil {
			rep.Violations = append(rep.Violations, "drain: "+drainErr.Error())
		}
		stopped = ctx.Err() != nil
	}
	for _, e := range faultErrs {
		rep.Violations = append(rep.Violations, "fault did not go as planned: "+e)
	}
	mrep := mon.Report()
	rep.Violations = append(rep.Violations, mrep.Violations...)

	title := "Soak report"
	if stopped {
		title = "Soak report, interrupted"
	}
	fmt.Fprintf(out, "\n## %s (%s of load, seed %d)\n\n", title, ran.Round(time.Second), o.Seed)
	sent, acked, retries, giveups := load.Stats()
	fmt.Fprintf(out, "load: %d starts sent, %d acknowledged (%.0f/s), %d retries, %d given up, %d cancelled by the load\n",
		sent, acked, float64(acked)/ran.Seconds(), retries, giveups, load.Cancels())
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
	wt, gt := f.Tuning()
	writeSettings(out, "worker settings the soak's fleet changes from the shipped defaults, for its faults (harvest-bench mix runs the same load on the defaults):", wt)
	writeSettings(out, "gateway settings it changes:", gt)
	if len(ramp.steps) > 0 {
		fmt.Fprint(out, ramp.String())
	}
	fmt.Fprint(out, mrep.String())
	if !stopped {
		fmt.Fprint(out, rep.String())
	} else if len(rep.Violations) > 0 {
		fmt.Fprintf(out, "VIOLATIONS so far:\n  %s\n", strings.Join(rep.Violations, "\n  "))
	}
	writeCPU(out, cpuFrom, cpuTo)
	writeMemory(out, mem)
	writeSizesOverTime(out, sizes)
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	writeSizes(out, sizesBefore, f.TableSizes(sctx))
	scancel()
	switch {
	case stopped:
		return ErrInterrupted
	case len(rep.Violations) > 0:
		return fmt.Errorf("soak: %d invariant violation(s)", len(rep.Violations))
	}
	return nil
}

// createShards creates two migrated shard databases named prefix, the
// process id and the shard's index, and returns their URLs and a function
// that drops them.
func createShards(ctx context.Context, serverURL, prefix string) ([]string, func(), error) {
	var urls []string
	var drops []func()
	dropAll := func() {
		for _, d := range drops {
			d()
		}
	}
	for i := range 2 {
		u, drop, err := createDB(ctx, serverURL, fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), i))
		if err != nil {
			dropAll()
			return nil, nil, err
		}
		drops = append(drops, drop)
		urls = append(urls, u)
	}
	return urls, dropAll, nil
}

// configureMix sets what the mixed load (mix.go) expects of the fleet:
// the weighted pair's weight, the priority band's ceiling and the metered
// quota, sized for rate starts per second.
func (f *Fleet) configureMix(ctx context.Context, rate float64) error {
	if _, err := f.Admin(0).SetWeight(ctx, Queue, PairHeavy, PairWeight); err != nil {
		return fmt.Errorf("soak: weight of %s: %w", PairHeavy, err)
	}
	// The priority band's tenant may go above the default priority only
	// once an operator allows it.
	if _, err := f.Admin(0).SetPriorityCeiling(ctx, f.Tenants()[0], UrgentPriority); err != nil {
		return fmt.Errorf("soak: priority ceiling of %s: %w", f.Tenants()[0], err)
	}
	return f.setMeteredQuota(ctx, rate)
}

// setMeteredQuota sizes the metered quota for rate starts per second: one
// start in twenty is under it, and its rate is twice theirs (at least 5 a
// second), so that its rechecks refuse now and then but its backlog
// drains. A ramp that raises the rate without it would leave the quota
// behind its arrivals, and the queue would then measure a quota's backlog
// (docs/reliability.md, "What breaks first", 2) rather than the rate.
func (f *Fleet) setMeteredQuota(ctx context.Context, rate float64) error {
	maxConc, qrate := 10, max(5, rate/10)
	qburst := max(1, qrate)
	if _, err := f.Admin(0).SetQuota(ctx, Queue, MeteredQuota, api.Quota{MaxConcurrent: &maxConc, Rate: &qrate, Burst: &qburst}); err != nil {
		return fmt.Errorf("soak: quota %s: %w", MeteredQuota, err)
	}
	return nil
}

// interrupted turns an error caused by the end of ctx into ErrInterrupted.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ErrInterrupted
	}
	return err
}

// drain waits for every run to finish, with progress lines, until ctx ends
// or ten minutes pass.
func drain(ctx context.Context, f *Fleet, logf func(string, ...any)) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- f.Drain(dctx, 8*time.Minute) }()
	progress := time.NewTicker(15 * time.Second)
	defer progress.Stop()
	for {
		select {
		case err := <-drained:
			return err
		case <-progress.C:
			logf("draining: %d unfinished runs", f.Unfinished(dctx))
		}
	}
}

type memSample struct {
	at  time.Duration
	rss map[string]int64
}

// writeMemory prints one column per process that was alive at some sample.
func writeMemory(out io.Writer, mem []memSample) {
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
		// Not ctx: the database goes even when the run was interrupted.
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
