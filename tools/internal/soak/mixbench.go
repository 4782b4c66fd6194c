package soak

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgpool"
)

// Defaults of MixOptions: the ramp of issue 35's report.
const (
	DefaultMixRate      = 100
	DefaultMixRampStep  = 100
	DefaultMixRampEvery = 45 * time.Second
	DefaultMixDuration  = 6 * time.Minute
)

// MixOptions configure RunMix.
type MixOptions struct {
	Bins Binaries
	// ServerURL is a Postgres server where RunMix may create (and drop)
	// two throwaway shard databases; its own database is where the
	// counters are read.
	ServerURL string
	// Duration bounds the ramp: it runs as many whole steps as fit.
	Duration time.Duration
	// Rate is the first step's starts per second, RampStep what each next
	// step adds (0: every step at Rate), RampEvery a step's length.
	Rate      float64
	RampStep  float64
	RampEvery time.Duration
	// WaitBound is the p95 claim wait that fails a step
	// (DefaultWaitBound).
	WaitBound time.Duration
	// WorkersPerShard is the number of worker processes per shard (2).
	WorkersPerShard int
	// MaxRuns is the gateways' HARVEST_MAX_RUNS (default 1,000,000: the
	// limit must not be what stops a ramp; the shipped 128 would).
	MaxRuns int
	Out     io.Writer
}

func (o *MixOptions) defaults() {
	if o.Duration <= 0 {
		o.Duration = DefaultMixDuration
	}
	if o.Rate <= 0 {
		o.Rate = DefaultMixRate
	}
	if o.RampEvery <= 0 {
		o.RampEvery = DefaultMixRampEvery
	}
	if o.WaitBound <= 0 {
		o.WaitBound = DefaultWaitBound
	}
	if o.WorkersPerShard <= 0 {
		o.WorkersPerShard = 2
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = 1_000_000
	}
}

// mixStep is one step of the mix's ramp: the soak's figures and the
// database's work.
type mixStep struct {
	rampStep
	offered   float64 // starts the load issued per second, the pair's bursts included
	claimsAll float64 // claims per second, the pair's included
	behind    int     // due tasks not claimed at the end of the step (without the pair)
	runs      int     // starts acknowledged in the step
	db        dbDelta
}

// RunMix is harvest-bench mix: the soak's mixed load (mix.go) with no
// fault, on a fleet that runs the gateways and workers on their shipped
// defaults, raised by RampStep every RampEvery until a step fails (its
// p95 claim wait passes WaitBound, the load cannot get its rate
// acknowledged, or a start is given up) or Duration is over. Each step
// reports its rates, claim waits and backlog, and per run the database's
// CPU, WAL, commits and statements. The load is then stopped without a
// drain: this is a benchmark, the soak is where promises are checked.
func RunMix(ctx context.Context, o MixOptions) error {
	o.defaults()
	out := o.Out
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "%s  %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	steps := max(1, int(o.Duration/o.RampEvery))
	top := o.Rate + float64(steps-1)*o.RampStep
	dir, err := os.MkdirTemp("", "harvest-mix-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	urls, drop, err := createShards(ctx, o.ServerURL, "harvest_mix")
	if err != nil {
		return interrupted(ctx, err)
	}
	defer drop()
	f, err := Start(ctx, Options{Bins: o.Bins, ShardURLs: urls, Dir: dir, Logf: logf, Shipped: true,
		WorkersPerShard: o.WorkersPerShard, MaxRuns: o.MaxRuns})
	if err != nil {
		return interrupted(ctx, err)
	}
	defer f.Close()
	// The mix checks no promise: the fault check's clock reads (ten a
	// second on each shard) would only add to the shards' commits.
	if f.clock != nil {
		f.clock.stop()
		f.clock = nil
	}
	if err := f.configureMix(ctx, o.Rate); err != nil {
		return interrupted(ctx, err)
	}
	standIn := f.AutovacuumOff(ctx)
	db, err := newDBSampler(ctx, f, o.ServerURL)
	if err != nil {
		return interrupted(ctx, err)
	}
	defer db.Close()

	fmt.Fprintf(out, "\n## The mix on shipped defaults\n\n")
	fmt.Fprintf(out, "fleet: 2 shards, %d gateways, %d workers per shard; %d cores, load average %s at the start\n",
		f.Gateways(), o.WorkersPerShard, runtime.NumCPU(), loadAverage())
	fmt.Fprintf(out, "shipped defaults: %s\n", shippedSummary())
	writeSettings(out, "the harness sets only these (everything else is the shipped default):",
		append(f.workerRequired(0, "w0-0"), f.gatewayRequired(0)...))
	if standIn {
		fmt.Fprintln(out, standInNote)
	}
	if !db.local {
		fmt.Fprintln(out, "the server is not on this machine (or its processes cannot be read): database CPU is n/a")
	}
	logf("ramp from %.0f starts/s, +%.0f every %s, %d steps at most (to %.0f starts/s), p95 claim wait bound %s",
		o.Rate, o.RampStep, o.RampEvery, steps, top, o.WaitBound)

	load, err := f.StartLoad(LoadOptions{Rate: o.Rate, Probe: true, Mixed: true, Inflight: max(256, int(2*top))})
	if err != nil {
		return interrupted(ctx, err)
	}
	defer load.Abort()
	vacT := newStandInTicker(standIn)
	defer vacT.Stop()
	var done []mixStep
	var cpuSteps []string
	cpu := newCPUSampler(f)
	fromCPU := cpu.snapshot()
	from, fromDB := time.Now(), db.sample(ctx)
	var fromSent int64
	var fromAcked, fromGiveups int
	stopped := false
ramp:
	for i := range steps {
		end := time.NewTimer(o.RampEvery)
	wait:
		for {
			select {
			case <-ctx.Done():
				end.Stop()
				stopped = true
				break ramp
			case <-vacT.C():
				vacuumAsWorkload(ctx, urls)
			case <-end.C:
				break wait
			}
		}
		now := time.Now()
		el := now.Sub(from)
		toDB := db.sample(ctx)
		cpu.sample()
		toCPU := cpu.snapshot()
		cpuSteps = append(cpuSteps, cpuLine(fromCPU, toCPU))
		sent, acked, _, giveups := load.Stats()
		st := mixStep{rampStep: rampStep{rate: load.Rate(), acked: float64(acked-fromAcked) / el.Seconds(),
			giveups: giveups - fromGiveups, unfinished: f.Unfinished(ctx)},
			offered: float64(sent-fromSent) / el.Seconds(), runs: acked - fromAcked, behind: f.Behind(ctx), db: fromDB.to(toDB)}
		all, claims, wait := f.claimFigures(ctx, el)
		st.claimsAll, st.claims, st.wait = float64(all)/el.Seconds(), float64(claims)/el.Seconds(), wait
		st.failed = st.judge(o.WaitBound)
		done = append(done, st)
		logf("step %d at %.0f starts/s: %s", i+1, st.rate, st.rampStep)
		if st.failed != "" {
			break
		}
		from, fromDB, fromCPU, fromSent, fromAcked, fromGiveups = now, toDB, toCPU, sent, acked, giveups
		if i+1 < steps && o.RampStep > 0 {
			next := load.Rate() + o.RampStep
			if err := f.setMeteredQuota(ctx, next); err != nil {
				logf("metered quota for %.0f starts/s: %v", next, err)
			}
			load.SetRate(next)
		}
	}
	load.Abort()
	if stopped {
		fmt.Fprintln(out, "\ninterrupted: here are the steps completed so far")
	}
	fmt.Fprintf(out, "\nload average at the end: %s\n\n", loadAverage())
	fmt.Fprint(out, mixTable(done))
	fmt.Fprint(out, mixLegend)
	fmt.Fprint(out, "\n"+workTable(done))
	fmt.Fprint(out, workLegend)
	fmt.Fprintln(out, "\nCPU by step (the processes' /proc times; postgres is every postgres process of the machine):")
	for i, l := range cpuSteps {
		fmt.Fprintf(out, "  step %d: %s\n", i+1, l)
	}
	fmt.Fprintln(out, "\n"+mixVerdict(done, stopped))
	if stopped {
		return ErrInterrupted
	}
	return nil
}

// vacuumAsWorkload does autovacuum's work on each shard in place of the
// server's (standInVacuum), over connections of the shard (not the
// harness's application name), so that its CPU counts as the database's
// work for the mix, as autovacuum's would.
func vacuumAsWorkload(ctx context.Context, urls []string) {
	for _, u := range urls {
		vctx, cancel := context.WithTimeout(ctx, time.Minute)
		cfg, err := pgx.ParseConfig(u)
		if err == nil {
			cfg.RuntimeParams["application_name"] = AppName + "-vacuum"
			if c, err := pgx.ConnectConfig(vctx, cfg); err == nil {
				_, _ = c.Exec(vctx, standInVacuum)
				_ = c.Close(vctx)
			}
		}
		cancel()
	}
}

// loadAverage is the machine's 1, 5 and 15 minute load averages ("?"
// where /proc/loadavg cannot be read).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// mixLegend says what each column of mixTable measures.
const mixLegend = `
offered/s: starts the load issued, its rate plus the weighted pair's bursts (twice the rate's
  ten seconds, every 15s); acked/s: those a gateway acknowledged.
claims/s: tasks claimed in the step over the shards, the pair's included.
claim wait: claimed_at - due_at of the step's claims (database clock, worst shard), the pair's
  bursts left out: they are made due all at once on purpose.
unfinished: runs not final at the step's end; behind: tasks due and not claimed then (without the pair).
per run: the step's figure divided by the starts acknowledged in it (a step that falls behind
  has not done all its starts' work by its end, so its figures per run read low).
db CPU: the shard databases' backends (each pg_stat_activity lists, /proc/<pid>/stat read every
  second; the harness's own reads left out) / every postgres process of the server (WAL writer,
  checkpointer and other databases' backends included).
WAL: pg_current_wal_lsn() moved by, the whole server's (other databases' work included: see
  other dbs' commits/s); "(checkpoint)": one began in the step, and the first change to each page
  after it writes the whole page, so such a step's WAL reads high.
commits: pg_stat_database.xact_commit of the shard databases.
statements: Execute and simple Query messages the gateways and workers sent to the shards,
  counted at the fleet's proxies (a default server has no pg_stat_statements); a statement that
  calls a function counts once.
`

// workLegend says what each column of workTable measures.
const workLegend = `
Where the database's work goes, by step. db CPU by client: the shard backends' CPU per run (as
  above) by the application_name of their connections: the gateways' pools (harvest-gateway:
  starts, cancels, reads), the workers' (harvest-worker: claims, outcomes, heartbeats, the
  janitor), and the rest (the harness's vacuum, anything unnamed).
statements per 100 runs, by kind, as the proxies read them from the SQL each executes: claim
  statements (and the tasks each took on average: the step's claims over its claim statements),
  outcome statements (completions, continuations, failures and releases of a batch), start
  groups (and the starts acknowledged per group), heartbeat statements; BEGIN and COMMIT and the
  WAL flush that follows a claim or a start group are not in these columns.
`

// workTable is, per step, the shard backends' CPU per run by client and
// the claim, outcome, start and heartbeat statements per 100 runs.
func workTable(steps []mixStep) string {
	var b strings.Builder
	b.WriteString("| starts/s asked | db CPU ms/run: gateways / workers / other | claim statements per 100 runs (tasks each) | outcome statements per 100 runs | start groups per 100 runs (starts each) | heartbeats per 100 runs |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, s := range steps {
		d := s.db
		if d.err != nil || s.runs <= 0 {
			fmt.Fprintf(&b, "| %.0f | - | - | - | - | - |\n", s.rate)
			continue
		}
		ms := func(t time.Duration) float64 { return float64(t) / float64(time.Millisecond) / float64(s.runs) }
		cpu := "n/a"
		if d.local {
			gw, wk := d.byApp[pgpool.AppGateway], d.byApp[pgpool.AppWorker]
			cpu = fmt.Sprintf("%.2f / %.2f / %.2f", ms(gw), ms(wk), ms(max(0, d.backendCPU-gw-wk)))
		}
		per100 := func(n int64) float64 { return 100 * float64(n) / float64(s.runs) }
		each := func(n float64, stmts int64) string {
			if stmts <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f", n/float64(stmts))
		}
		fmt.Fprintf(&b, "| %.0f | %s | %.1f (%s) | %.1f | %.1f (%s) | %.1f |\n", s.rate, cpu,
			per100(d.kinds[kindClaim]), each(s.claimsAll*d.el.Seconds(), d.kinds[kindClaim]),
			per100(d.kinds[kindOutcome]),
			per100(d.kinds[kindStart]), each(float64(s.runs), d.kinds[kindStart]),
			per100(d.kinds[kindHeartbeat]))
	}
	return b.String()
}

// mixTable is the steps as a Markdown table, per run figures divided by
// the starts acknowledged in the step.
func mixTable(steps []mixStep) string {
	var b strings.Builder
	b.WriteString("| starts/s asked | offered/s | acked/s | claims/s | claim wait p50 / p95 / p99 | unfinished | behind | db CPU ms/run (shard backends / server) | WAL KiB/run | commits/run | statements/run | other dbs' commits/s | outcome |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range steps {
		outcome := "held"
		if s.failed != "" {
			outcome = "failed: " + s.failed
		}
		cpu, wal, commits, stmts, others := perRun(s.db, s.runs)
		fmt.Fprintf(&b, "| %.0f | %.0f | %.0f | %.0f | %s / %s / %s | %d | %d | %s | %s | %s | %s | %s | %s |\n",
			s.rate, s.offered, s.acked, s.claimsAll,
			s.wait[0].Round(time.Millisecond), s.wait[1].Round(time.Millisecond), s.wait[2].Round(time.Millisecond),
			s.unfinished, s.behind, cpu, wal, commits, stmts, others, outcome)
	}
	return b.String()
}

// perRun formats the database's work of a step per acknowledged start:
// CPU in ms (shard backends / every postgres process; n/a when the server
// is not local), WAL in KiB, commits, statements, and the other
// databases' commits per second (what the rest of the server was doing).
func perRun(d dbDelta, runs int) (cpu, wal, commits, stmts, others string) {
	if d.err != nil || runs <= 0 {
		return "-", "-", "-", "-", "-"
	}
	per := func(v float64) float64 { return v / float64(runs) }
	cpu = "n/a"
	if d.local {
		cpu = fmt.Sprintf("%.2f / %.2f", per(float64(d.backendCPU)/float64(time.Millisecond)), per(float64(d.serverCPU)/float64(time.Millisecond)))
	}
	wal = fmt.Sprintf("%.1f", per(float64(d.wal)/1024))
	if d.checkpoints > 0 {
		wal += " (checkpoint)"
	}
	commits = fmt.Sprintf("%.1f", per(float64(d.commits)))
	stmts = fmt.Sprintf("%.1f", per(float64(d.statements)))
	if d.uncounted > 0 {
		stmts += fmt.Sprintf(" (%d connections uncounted)", d.uncounted)
	}
	others = "-"
	if d.el > 0 {
		others = fmt.Sprintf("%.0f", float64(d.others)/d.el.Seconds())
	}
	return cpu, wal, commits, stmts, others
}

// mixVerdict is the line that ends the report: the highest rate held and
// where the ramp stopped.
func mixVerdict(steps []mixStep, interrupted bool) string {
	held := -1.0
	for _, s := range steps {
		if s.failed != "" {
			break
		}
		held = s.rate
	}
	switch {
	case len(steps) == 0:
		return "no step completed"
	case held < 0:
		return fmt.Sprintf("highest rate held: none (the first step, %.0f starts/s, failed)", steps[0].rate)
	case steps[len(steps)-1].failed != "":
		last := steps[len(steps)-1]
		return fmt.Sprintf("highest rate held: %.0f starts/s (failed at %.0f: %s)", held, last.rate, last.failed)
	case interrupted:
		return fmt.Sprintf("highest rate held: %.0f starts/s (interrupted before a step failed)", held)
	}
	return fmt.Sprintf("highest rate held: %.0f starts/s (every step held: --minutes ended the ramp before it broke)", held)
}
