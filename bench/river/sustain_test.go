package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// river-bench sustain prints one JSON line per step with the fields
// harvest-bench sustain reads, judged by the same rule, and stops after
// the steps asked for.
func TestSustainSmallRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL())
	if err != nil {
		t.Skipf("no PostgreSQL at %s: %v", redact(databaseURL()), err)
	}
	conn.Close(context.Background())

	cmd := exec.Command(os.Args[0], "sustain", "-rates", "20,40", "-step", "1s", "-senders", "4", "-slots", "10", "-pool-size", "4")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("river-bench sustain failed: %v\nstderr:\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a line per step, got %d:\n%s", len(lines), stdout.String())
	}
	for i, line := range lines {
		var s sustainStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, line)
		}
		if s.Bench != "sustain" || s.System != "river" || s.Rate != []int{20, 40}[i] || s.Offered != s.Rate {
			t.Errorf("wrong identity fields: %s", line)
		}
		if s.Acked != s.Claimed+s.Unclaimed || s.Acked < 1 || s.Errors != 0 {
			t.Errorf("every inserted job is fetched or counted unfetched: %s", line)
		}
		if s.WaitP50 > s.WaitP95 || s.WaitP95 > s.WaitP99 {
			t.Errorf("percentiles out of order: %s", line)
		}
		want := float64(s.Acked) >= 0.95*float64(s.Offered) && s.WaitP95 < 1000 && s.Unclaimed == 0
		if s.Holds != want {
			t.Errorf("holds %v, want %v by the rule: %s", s.Holds, want, line)
		}
	}
}
