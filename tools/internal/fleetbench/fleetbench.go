// Package fleetbench is `harvest-bench fleet`: a flood of no-op tasks from
// one key drained by a fleet of real worker processes, with a light tenant
// starting runs through a real gateway over NATS while the flood drains;
// optionally side by side with River on the same workload (bench/river).
package fleetbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harvest-run/harvest/internal/natsembed"
)

// Config describes a benchmark run.
type Config struct {
	// ServerURL is any database on the PostgreSQL server; every run gets a
	// fresh database beside it.
	ServerURL string
	// NATSURL names a NATS server; empty starts one inside the benchmark,
	// so that no other gateway or worker on a shared server sees its
	// messages.
	NATSURL string

	Flood     int     // pre-inserted no-op tasks of the heavy key (100,000)
	Workers   int     // worker processes (2)
	Slots     int     // task slots per worker; Workers*Slots is River's -slots
	LightRate float64 // light tenant's starts per second, from 1 s into the drain (1)
	// ClaimBatch and Claimers configure the workers' batch mode
	// (HARVEST_WORKER_CLAIM_BATCH, HARVEST_WORKER_BATCH_CLAIMERS); a
	// ClaimBatch of 1 runs the one-claim-per-task loops.
	ClaimBatch int
	Claimers   int
	Fair       []bool // Harvest runs of each pair: fairness on and/or off, in this order
	// VsRiver adds to each round, after its first Harvest run, River as it
	// ships, River tuned (RiverCooldown) and the floor (floor.go).
	VsRiver bool
	// RiverCooldown is the tuned River run's fetch cooldown (1ms, River's
	// smallest, when zero).
	RiverCooldown time.Duration
	Pairs         int // rounds (3)
	// MaxDuration bounds each run's drain; a run that has not drained by
	// then is reported with drained false.
	MaxDuration time.Duration

	WorkerBin, GatewayBin, RiverBin string // built binaries
	OutDir                          string // logs, profiles, per-second series
	ChartDir                        string // SVG charts ("" : none)
	Profile                         bool   // CPU profile of worker 0 in each Harvest run
	// NoJanitor runs no janitor at all (normally worker 0 runs it), to
	// measure what its ticks cost the drain.
	NoJanitor bool

	Out io.Writer // JSON lines, then the table
	Log io.Writer // progress (nil: none)
}

// KeyShare is one fairness key's claims over the drain.
type KeyShare struct {
	Key    string  `json:"key"`
	Claims int     `json:"claims"`
	PerSec float64 `json:"claims_per_s"`
	Share  float64 `json:"share"`
}

// Result is one run's figures. Times in ms, memory in MiB.
type Result struct {
	Bench           string     `json:"bench"`
	System          string     `json:"system"` // harvest or river
	Pair            int        `json:"pair"`
	Fair            *bool      `json:"fair,omitempty"`
	Flood           int        `json:"flood"`
	Workers         int        `json:"workers,omitempty"`
	Slots           int        `json:"slots"` // total concurrent task slots
	ClaimBatch      int        `json:"claim_batch,omitempty"`
	LightRate       float64    `json:"light_rate"`
	DrainS          float64    `json:"drain_s"`
	TasksPerS       float64    `json:"tasks_per_s"`
	LightJobs       int        `json:"light_jobs"`
	LightP50        float64    `json:"light_wait_p50_ms"`
	LightP99        float64    `json:"light_wait_p99_ms"`
	LightMax        float64    `json:"light_wait_max_ms"`
	LightUnstarted  int        `json:"light_unstarted"`
	LightErrors     int        `json:"light_start_errors,omitempty"`
	Drained         bool       `json:"drained"`
	WorkerRSSMB     []float64  `json:"worker_peak_rss_mb,omitempty"`
	GatewayRSSMB    float64    `json:"gateway_peak_rss_mb,omitempty"`
	PeakRSSMB       float64    `json:"peak_rss_mb,omitempty"` // River's process
	Keys            []KeyShare `json:"keys,omitempty"`
	Load1           [2]float64 `json:"load1"` // 1-minute load average at start and end
	FetchCooldownMS float64    `json:"fetch_cooldown_ms,omitempty"`
	// The database server's CPU time and WAL per task from the start of
	// the workers (River: its client) until the flood drained; see
	// dbcost.go.
	DBCPUPerTaskUS  float64 `json:"db_cpu_us_per_task,omitempty"`
	WALBytesPerTask float64 `json:"wal_bytes_per_task,omitempty"`
	// The CPU time of the system's own processes per task over the same
	// window: Harvest's workers and gateway, River's client process (the
	// floor runs inside this benchmark and has none). Beside the database's
	// figure it says where the rest of the machine went.
	AppCPUPerTaskUS float64 `json:"app_cpu_us_per_task,omitempty"`
	Series          string  `json:"series,omitempty"` // file with the per-second claims per key
	// Checkpoints counts the database server's checkpoints that began
	// during the drain; LightWaits names the file with each light run's
	// wait beside its due time, those checkpoints' starts and the ends of
	// the analyzes of the shard's tables, to tell what the slowest light
	// runs fell into.
	Checkpoints int        `json:"checkpoints"`
	LightWaits  string     `json:"light_waits,omitempty"`
	Profile     string     `json:"cpu_profile,omitempty"`
	Functions   []FuncStat `json:"pg_functions,omitempty"` // top SQL functions by own time
	Janitor     *bool      `json:"janitor,omitempty"`      // whether worker 0 ran the janitor

	perSecond map[string][]int // claims per key per second since the first claim
	light     lightLog         // the light runs' waits, the drain's checkpoints and analyzes
}

// PairResult compares the runs of one round.
type PairResult struct {
	Bench         string  `json:"bench"`
	Pair          int     `json:"pair"`
	HarvestFair   float64 `json:"harvest_fair_tasks_per_s,omitempty"`
	HarvestOff    float64 `json:"harvest_unfair_tasks_per_s,omitempty"`
	River         float64 `json:"river_tasks_per_s,omitempty"`       // as shipped
	RiverTuned    float64 `json:"river_tuned_tasks_per_s,omitempty"` // RiverCooldown
	Floor         float64 `json:"floor_tasks_per_s,omitempty"`
	VsRiver       float64 `json:"harvest_fair_over_river,omitempty"`
	VsRiverTuned  float64 `json:"harvest_fair_over_river_tuned,omitempty"`
	OfFloor       float64 `json:"harvest_fair_over_floor,omitempty"`
	FairCostPct   float64 `json:"fairness_cost_pct,omitempty"`
	FairLightP99  float64 `json:"harvest_fair_light_p99_ms,omitempty"`
	RiverLightP99 float64 `json:"river_light_p99_ms,omitempty"`
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// Run runs every round and writes JSON lines, then a table and the charts.
func Run(ctx context.Context, cfg Config) ([]Result, []PairResult, error) {
	if cfg.Flood <= 0 || cfg.Workers <= 0 || cfg.Slots <= 0 || cfg.Pairs <= 0 {
		return nil, nil, errors.New("fleetbench: flood, workers, slots and pairs must be positive")
	}
	if len(cfg.Fair) == 0 {
		return nil, nil, errors.New("fleetbench: no Harvest mode to run")
	}
	if cfg.RiverCooldown == 0 {
		cfg.RiverCooldown = time.Millisecond
	}
	if cfg.OutDir != "" {
		if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
			return nil, nil, err
		}
	}
	natsURL := cfg.NATSURL
	if natsURL == "" {
		ns, err := natsembed.Start(natsembed.Options{})
		if err != nil {
			return nil, nil, err
		}
		defer ns.Shutdown()
		natsURL = ns.URL()
	}
	enc := json.NewEncoder(cfg.Out)
	var (
		results []Result
		pairs   []PairResult
	)
	for p := 1; p <= cfg.Pairs; p++ {
		pr := PairResult{Bench: "fleet-pair", Pair: p}
		run := func(r Result, err error) error {
			if err != nil {
				return err
			}
			r.Pair = p
			results = append(results, r)
			return enc.Encode(r)
		}
		for i, fair := range cfg.Fair {
			cfg.logf("fleet: round %d/%d: Harvest, fairness %s", p, cfg.Pairs, onOff(fair))
			r, err := runHarvest(ctx, &cfg, natsURL, fair, p)
			if err := run(r, err); err != nil {
				return results, pairs, err
			}
			if fair {
				pr.HarvestFair, pr.FairLightP99 = r.TasksPerS, r.LightP99
			} else {
				pr.HarvestOff = r.TasksPerS
			}
			// River runs right after the first Harvest run of the round, so
			// that each round alternates A B (A').
			if i == 0 && cfg.VsRiver {
				cfg.logf("fleet: round %d/%d: River as shipped", p, cfg.Pairs)
				r, err := runRiver(ctx, &cfg, 0)
				if err := run(r, err); err != nil {
					return results, pairs, err
				}
				pr.River, pr.RiverLightP99 = r.TasksPerS, r.LightP99
				cfg.logf("fleet: round %d/%d: River tuned (fetch cooldown %s)", p, cfg.Pairs, cfg.RiverCooldown)
				r, err = runRiver(ctx, &cfg, cfg.RiverCooldown)
				if err := run(r, err); err != nil {
					return results, pairs, err
				}
				pr.RiverTuned = r.TasksPerS
				cfg.logf("fleet: round %d/%d: the floor", p, cfg.Pairs)
				r, err = runFloor(ctx, &cfg)
				if err := run(r, err); err != nil {
					return results, pairs, err
				}
				pr.Floor = r.TasksPerS
			}
		}
		if pr.HarvestFair > 0 {
			for _, c := range []struct {
				of  float64
				out *float64
			}{{pr.River, &pr.VsRiver}, {pr.RiverTuned, &pr.VsRiverTuned}, {pr.Floor, &pr.OfFloor}} {
				if c.of > 0 {
					*c.out = round(pr.HarvestFair / c.of)
				}
			}
		}
		if pr.HarvestOff > 0 && pr.HarvestFair > 0 {
			pr.FairCostPct = round(100 * (1 - pr.HarvestFair/pr.HarvestOff))
		}
		pairs = append(pairs, pr)
		if err := enc.Encode(pr); err != nil {
			return results, pairs, err
		}
	}
	WriteTable(cfg.Out, results, pairs)
	if cfg.ChartDir != "" {
		var on, off *Result
		for i := range results {
			r := &results[i]
			if r.System == "harvest" && r.Fair != nil {
				if *r.Fair {
					on = r
				} else {
					off = r
				}
			}
		}
		if err := os.MkdirAll(cfg.ChartDir, 0o755); err != nil {
			return results, pairs, fmt.Errorf("fleetbench: chart directory: %w", err)
		}
		path := filepath.Join(cfg.ChartDir, "fleet-keys.svg")
		if err := KeyChart(path, on, off); err != nil {
			return results, pairs, err
		}
		cfg.logf("fleet: wrote %s", path)
	}
	return results, pairs, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// WriteTable prints the runs and the rounds readably.
func WriteTable(w io.Writer, results []Result, pairs []PairResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tsystem\tfair\tslots\ttasks/s\tdrain s\tlight n\tlight p50 ms\tlight p99 ms\tlight max ms\tdb CPU µs/task\tapp CPU µs/task\tWAL B/task\tpeak RSS MB (workers; gateway)\tdrained\t")
	for _, r := range results {
		fair := "-"
		if r.Fair != nil {
			fair = onOff(*r.Fair)
		}
		system := r.System
		if r.System == "river" {
			system = fmt.Sprintf("river (%g ms cooldown)", r.FetchCooldownMS)
		}
		var rss string
		if r.System == "harvest" {
			var ws []string
			for _, m := range r.WorkerRSSMB {
				ws = append(ws, fmt.Sprintf("%.1f", m))
			}
			rss = strings.Join(ws, ", ") + fmt.Sprintf("; %.1f", r.GatewayRSSMB)
		} else if r.System == "river" {
			rss = fmt.Sprintf("%.1f", r.PeakRSSMB)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.0f\t%.1f\t%d\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%s\t%v\t\n",
			r.Pair, system, fair, r.Slots, r.TasksPerS, r.DrainS, r.LightJobs, r.LightP50, r.LightP99, r.LightMax,
			r.DBCPUPerTaskUS, r.AppCPUPerTaskUS, r.WALBytesPerTask, rss, r.Drained)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tharvest fair/s\tharvest unfair/s\triver shipped/s\triver tuned/s\tfloor/s\tfair / river shipped\tfair / river tuned\tfair / floor\tfairness cost %\t")
	for _, p := range pairs {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.1f\t\n", p.Pair, p.HarvestFair, p.HarvestOff,
			p.River, p.RiverTuned, p.Floor, p.VsRiver, p.VsRiverTuned, p.OfFloor, p.FairCostPct)
	}
	_ = tw.Flush()
}

func round(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// loadAvg reads the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}

// peakRSS reads a process's peak resident memory (VmHWM) in MiB.
func peakRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb float64
			_, _ = fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%f", &kb)
			return round(kb / 1024)
		}
	}
	return 0
}
