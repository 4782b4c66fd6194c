package startbench

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
	"time"

	"github.com/harvest-run/harvest/tools/internal/child"
)

// RiverConfig is River's side of the sustained benchmark: river-bench
// sustain (bench/river), driven the way Harvest is: one Insert per job
// from as many goroutines as Harvest has senders, at the same rates.
type RiverConfig struct {
	// Bin is the river-bench binary.
	Bin string
	// Slots is River's MaxWorkers (100); FetchCooldown its fetch
	// cooldown (1ms, River's smallest); PoolSize its pgx pool.
	Slots         int
	FetchCooldown time.Duration
	PoolSize      int
	// Set by RunSustain from its own configuration.
	ServerURL string
	Rates     []int
	Step      time.Duration
	Senders   int
	KeepGoing bool
}

// RunRiverSustain runs river-bench sustain and returns its steps, read
// from the JSON lines it prints (the same fields as Harvest's).
func RunRiverSustain(ctx context.Context, rc RiverConfig, log io.Writer) ([]StepResult, error) {
	rates := make([]string, len(rc.Rates))
	for i, r := range rc.Rates {
		rates[i] = strconv.Itoa(r)
	}
	args := []string{"sustain",
		"-database-url", rc.ServerURL,
		"-rates", strings.Join(rates, ","),
		"-step", rc.Step.String(),
		"-senders", strconv.Itoa(rc.Senders),
		"-slots", strconv.Itoa(max(rc.Slots, 1)),
		"-fetch-cooldown", rc.FetchCooldown.String(),
		"-pool-size", strconv.Itoa(max(rc.PoolSize, 2)),
	}
	if rc.KeepGoing {
		args = append(args, "-keep-going")
	}
	cmd := exec.CommandContext(ctx, rc.Bin, args...)
	child.Detach(cmd)
	var out bytes.Buffer
	cmd.Stdout = &out
	if log != nil {
		cmd.Stderr = log
	}
	err := cmd.Run()
	var steps []StepResult
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var s StepResult
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.Bench == "sustain" {
			s.System = "river"
			steps = append(steps, s)
		}
	}
	if err != nil {
		return steps, fmt.Errorf("startbench: river-bench sustain: %w", err)
	}
	return steps, nil
}
