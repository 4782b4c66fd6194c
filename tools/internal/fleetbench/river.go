package fleetbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/tools/internal/child"
)

// riverLine is the JSON line of bench/river.
type riverLine struct {
	DrainS          float64 `json:"drain_s"`
	TasksPerS       float64 `json:"tasks_per_s"`
	LightJobs       int     `json:"light_jobs"`
	LightP50        float64 `json:"light_wait_p50_ms"`
	LightP99        float64 `json:"light_wait_p99_ms"`
	LightMax        float64 `json:"light_wait_max_ms"`
	LightUnstarted  int     `json:"light_unstarted"`
	PeakRSSMB       float64 `json:"peak_rss_mb"`
	Drained         bool    `json:"drained"`
	Slots           int     `json:"slots"`
	FetchCooldownMS float64 `json:"fetch_cooldown_ms"`
}

// runRiver runs bench/river with the same flood, total slots and light
// rate: as it ships when cooldown is zero (River's default fetch
// cooldown), else tuned to that cooldown. The database's cost is sampled
// when it reports its client started and when the flood drained (its
// progress lines on stderr), so River's migrations and flood insert are
// left out, as Harvest's fill is.
func runRiver(ctx context.Context, cfg *Config, cooldown time.Duration) (Result, error) {
	res := Result{Bench: "fleet", System: "river", Flood: cfg.Flood, Slots: cfg.Workers * cfg.Slots, LightRate: cfg.LightRate}
	res.Load1[0] = loadAvg()
	server, err := pgxpool.New(ctx, cfg.ServerURL)
	if err != nil {
		return res, fmt.Errorf("river: server: %w", err)
	}
	defer server.Close()
	args := []string{
		"-flood", strconv.Itoa(cfg.Flood),
		"-slots", strconv.Itoa(cfg.Workers * cfg.Slots),
		"-light-rate", strconv.FormatFloat(cfg.LightRate, 'f', -1, 64),
		"-max-duration", cfg.MaxDuration.String(),
		"-database-url", cfg.ServerURL,
	}
	if cooldown > 0 {
		args = append(args, "-fetch-cooldown", cooldown.String())
	}
	cmd := exec.CommandContext(ctx, cfg.RiverBin, args...)
	child.Detach(cmd)
	var out bytes.Buffer
	cmd.Stdout = &out
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	var (
		samples  []dbSample
		appCPUs  []time.Duration
		sampleMu sync.Mutex
		scanned  = make(chan struct{})
	)
	if err := cmd.Start(); err != nil {
		_ = pw.Close()
		return res, fmt.Errorf("river-bench: %w", err)
	}
	pid := cmd.Process.Pid
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "client started:") || strings.Contains(line, "flood drained after") {
				if s, err := sampleDB(ctx, server); err == nil {
					sampleMu.Lock()
					samples = append(samples, s)
					appCPUs = append(appCPUs, appCPU(pid))
					sampleMu.Unlock()
				}
			}
			if cfg.Log != nil {
				fmt.Fprintln(cfg.Log, line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	runErr := cmd.Wait()
	_ = pw.Close()
	<-scanned
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	var rl riverLine
	if err := json.Unmarshal([]byte(last), &rl); err != nil {
		return res, fmt.Errorf("river-bench: %v; no JSON line (%v)", runErr, err)
	}
	res.DrainS, res.TasksPerS, res.LightJobs = rl.DrainS, rl.TasksPerS, rl.LightJobs
	res.LightP50, res.LightP99, res.LightMax, res.LightUnstarted = rl.LightP50, rl.LightP99, rl.LightMax, rl.LightUnstarted
	res.PeakRSSMB, res.Drained, res.FetchCooldownMS = rl.PeakRSSMB, rl.Drained, rl.FetchCooldownMS
	res.Load1[1] = loadAvg()
	if len(samples) == 2 {
		if err := cost(ctx, server, samples[0], samples[1], cfg.Flood+rl.LightJobs, &res); err != nil {
			return res, fmt.Errorf("river: database cost: %w", err)
		}
		appCost(appCPUs[0], appCPUs[1], cfg.Flood+rl.LightJobs, &res)
	}
	if runErr != nil && rl.Drained {
		return res, fmt.Errorf("river-bench: %w", runErr)
	}
	cfg.logf("fleet: river (fetch cooldown %g ms): %.0f tasks/s over %.1f s, light p99 %.1f ms", res.FetchCooldownMS, res.TasksPerS, res.DrainS, res.LightP99)
	return res, nil
}
