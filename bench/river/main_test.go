package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// With this variable set the test binary behaves as river-bench itself, so the
// test below checks the real stdout/stderr/exit-code contract.
const asMainEnv = "RIVER_BENCH_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func databaseURL() string {
	if u := os.Getenv("HARVEST_DATABASE_URL"); u != "" {
		return u
	}
	return defaultDatabaseURL
}

func TestSmallRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL())
	if err != nil {
		t.Skipf("no PostgreSQL at %s: %v", redact(databaseURL()), err)
	}
	defer conn.Close(context.Background())

	// 2,000 jobs at 20 slots take about 10 s with River's default fetch
	// cooldown (20 jobs per 100 ms).
	cmd := exec.Command(os.Args[0], "-flood", "2000", "-slots", "20", "-light-rate", "5", "-max-duration", "45s")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("river-bench failed: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Logf("stderr:\n%s", stderr.String())

	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want exactly one stdout line, got %d:\n%s", len(lines), stdout.String())
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &res); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, lines[0])
	}
	for _, k := range []string{"bench", "flood", "slots", "drain_s", "tasks_per_s", "light_jobs",
		"light_wait_p50_ms", "light_wait_p99_ms", "light_wait_max_ms", "peak_rss_mb"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, lines[0])
		}
	}
	num := func(k string) float64 { v, _ := res[k].(float64); return v }
	if res["bench"] != "river" || num("flood") != 2000 || num("slots") != 20 {
		t.Errorf("wrong identity fields: %s", lines[0])
	}
	if res["drained"] != true || num("flood_completed") != 2000 {
		t.Errorf("flood not fully completed: %s", lines[0])
	}
	if num("drain_s") <= 0 || num("tasks_per_s") <= 0 {
		t.Errorf("no drain measured: %s", lines[0])
	}
	if d := num("drain_s"); d*num("tasks_per_s") < 1900 || d*num("tasks_per_s") > 2100 {
		t.Errorf("drain_s x tasks_per_s should be about the 2000 jobs completed: %s", lines[0])
	}
	if num("light_jobs") < 1 || num("light_unstarted") != 0 {
		t.Errorf("want light jobs, all attempted: %s", lines[0])
	}
	p50, p99, mx := num("light_wait_p50_ms"), num("light_wait_p99_ms"), num("light_wait_max_ms")
	if p50 <= 0 || p50 > p99 || p99 > mx || mx > num("drain_s")*1000+1000 {
		t.Errorf("light wait percentiles out of order or beyond the drain: %s", lines[0])
	}
	if rss := num("peak_rss_mb"); rss <= 0 || rss > 1024 {
		t.Errorf("implausible peak RSS: %s", lines[0])
	}

	// The throwaway database must be gone.
	m := regexp.MustCompile(`created database (harvest_river_[0-9a-f]+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr does not name the database:\n%s", stderr.String())
	}
	qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer qcancel()
	var exists bool
	if err := conn.QueryRow(qctx, "SELECT exists(SELECT 1 FROM pg_database WHERE datname = $1)", m[1]).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s was not dropped", m[1])
	}
}

func TestBadFlagFailsWithoutDatabase(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-slots", "0")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		t.Fatal("want a non-zero exit for -slots 0")
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "-slots must be") {
		t.Errorf("want a clear message on stderr and nothing on stdout; stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

func TestPercentile(t *testing.T) {
	vals := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {100, 10}, {10, 1}, {0, 1}} {
		if got := percentile(vals, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("empty: %v", got)
	}
}
