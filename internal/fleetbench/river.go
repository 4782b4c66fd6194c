package fleetbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
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

// runRiver runs bench/river as it ships (River's default fetch cooldown)
// with the same flood, total slots and light rate.
func runRiver(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Bench: "fleet", System: "river", Flood: cfg.Flood, Slots: cfg.Workers * cfg.Slots, LightRate: cfg.LightRate}
	res.Load1[0] = loadAvg()
	cmd := exec.CommandContext(ctx, cfg.RiverBin,
		"-flood", strconv.Itoa(cfg.Flood),
		"-slots", strconv.Itoa(cfg.Workers*cfg.Slots),
		"-light-rate", strconv.FormatFloat(cfg.LightRate, 'f', -1, 64),
		"-max-duration", cfg.MaxDuration.String(),
		"-database-url", cfg.ServerURL,
	)
	var out bytes.Buffer
	cmd.Stdout = &out
	if cfg.Log != nil {
		cmd.Stderr = cfg.Log
	} else {
		cmd.Stderr = io.Discard
	}
	runErr := cmd.Run()
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
	if runErr != nil && rl.Drained {
		return res, fmt.Errorf("river-bench: %w", runErr)
	}
	cfg.logf("fleet: river: %.0f tasks/s over %.1f s, light p99 %.1f ms", res.TasksPerS, res.DrainS, res.LightP99)
	return res, nil
}
