package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// benchBin builds harvest-bench once for the interrupt tests.
var benchBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "harvest-faults-bench-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "harvest-bench")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/harvest-bench")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
})

// A soak stopped by SIGINT or SIGTERM, while it sets up or while its load
// runs, exits 130 with the report of what it saw, and leaves neither a
// process nor a database behind.
//
// Not parallel: the command's output is copied by goroutines of os/exec,
// which the goroutine-leak checks of the parallel fault tests would count
// as theirs.
func TestSoakStopsCleanlyOnSignal(t *testing.T) {
	bin, err := benchBin()
	require.NoError(t, err)
	server := testsvc.ServerURL(t)
	for _, c := range []struct {
		name  string
		sig   syscall.Signal
		after string // the line of output the signal waits for ("" : none)
	}{
		{"SIGINT while the load runs", syscall.SIGINT, "fault "},
		{"SIGTERM while the load runs", syscall.SIGTERM, "soak for "},
		// Once its first database exists: the fleet is starting.
		{"SIGINT while the fleet starts", syscall.SIGINT, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "soak", "--minutes", "5", "--rate", "20", "--fault-every", "2s", "--slots", "4")
			cmd.Env = append(os.Environ(), "HARVEST_DATABASE_URL="+server)
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			lines := make(chan string, 1024)
			var all strings.Builder
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			conn, err := pgx.Connect(ctx, server)
			require.NoError(t, err)
			defer conn.Close(context.Background())
			pid := cmd.Process.Pid
			dbs := func() int {
				var n int
				require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE $1`,
					fmt.Sprintf("harvest_soak_%d_%%", pid)).Scan(&n))
				return n
			}
			if c.after == "" {
				require.Eventually(t, func() bool { return dbs() > 0 }, time.Minute, 10*time.Millisecond)
			} else {
			wait:
				for {
					select {
					case l, ok := <-lines:
						require.True(t, ok, "the soak ended before %q: %s", c.after, all.String())
						all.WriteString(l + "\n")
						if strings.Contains(l, c.after) {
							break wait
						}
					case <-ctx.Done():
						t.Fatalf("no %q line: %s", c.after, all.String())
					}
				}
			}
			require.NoError(t, cmd.Process.Signal(c.sig))
			for l := range lines {
				all.WriteString(l + "\n")
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "exit: %v\n%s", err, all.String())
			require.Equal(t, 130, ee.ExitCode(), "stdout:\n%s\nstderr:\n%s", all.String(), stderr.String())
			require.Contains(t, stderr.String(), "interrupted")
			if c.after != "" {
				require.Contains(t, all.String(), "Soak report, interrupted")
				require.Contains(t, all.String(), "RSS in MiB")
			}

			// Nothing left: no database of this run's pid, no process of
			// its fleet (they run as this binary with --role).
			require.Zero(t, dbs(), "databases left behind")
			require.Empty(t, fleetProcesses(bin), "processes left behind")
		})
	}
}

// fleetProcesses lists the live processes running bin in a role.
func fleetProcesses(bin string) []string {
	var out []string
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 0 && args[0] == bin && strings.Contains(string(b), "--role") {
			out = append(out, p)
		}
	}
	return out
}
