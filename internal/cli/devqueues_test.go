package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// syncBuffer is a bytes.Buffer the fleet's goroutines may log to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harvest dev --queues a,b:3 serves the queues named: a run on b
// completes. A start on a queue it does not serve draws one warning per
// queue naming the queue and --queues; such a run stays queued, which
// runs list shows and runs cancel ends. The flood demo, with stderr not a
// terminal, prints no progress bar. Not parallel: t.Setenv.
func TestDevQueuesRunsAndDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole dev fleet")
	}
	t.Setenv("HARVEST_DATABASE_URL", testsvc.ServerURL(t))
	envFile := filepath.Join(t.TempDir(), "dev.env")
	var devOut, devErr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runDev(ctx, env{stdout: &devOut, stderr: &devErr},
			[]string{"--queues", "a,b:3", "--http", "127.0.0.1:0", "--env-file", envFile})
	}()
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		_, err := os.Stat(envFile)
		return err == nil
	}, 2*time.Minute, 20*time.Millisecond, "harvest dev never became ready")
	select {
	case err := <-done:
		t.Fatalf("harvest dev stopped early: %v\n%s", err, devErr.String())
	default:
	}
	require.Contains(t, devOut.String(), "queues      a,b:3")
	vars := readEnvFile(t, envFile)
	for k, v := range vars {
		t.Setenv(k, v)
	}
	t.Setenv("HARVEST_TOKEN", vars["HARVEST_TENANT_1_TOKEN"])

	startJSON := func(args ...string) api.Run {
		t.Helper()
		code, out, errOut := run(t, nil, append([]string{"start", "--json"}, args...)...)
		require.Equal(t, 0, code, errOut)
		var r api.Run
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		return r
	}

	// Queue b is served.
	r := startJSON("--queue", "b", "--wait", "30s", "echo", `{"hi":1}`)
	require.Equal(t, api.StatusCompleted, r.Status)

	// Queue c is not: a warning naming it and the flag, once.
	c1 := startJSON("--queue", "c", "echo")
	require.Eventually(t, func() bool { return strings.Contains(devErr.String(), `queue \"c\"`) },
		30*time.Second, 10*time.Millisecond, "no warning for queue c:\n%s", devErr.String())
	require.Contains(t, devErr.String(), "--queues a,b:3,c")
	c2 := startJSON("--queue", "c", "echo")
	// The watcher sees wake-ups in order: once d's warning is there, c's
	// second start has been seen too.
	startJSON("--queue", "d", "echo")
	require.Eventually(t, func() bool { return strings.Contains(devErr.String(), `queue \"d\"`) },
		30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, strings.Count(devErr.String(), `on queue \"c\"`), "queue c warned once:\n%s", devErr.String())

	// runs list: a table of the two queued runs of c, newest first.
	code, out, errOut := run(t, nil, "runs", "list", "--queue", "c", "--status", "queued")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Equal(t, []string{"ID", "STATUS", "QUEUE", "NAME", "CREATED"}, strings.Fields(lines[0]))
	require.Equal(t, []string{c2.ID, "queued", "c", "echo"}, strings.Fields(lines[1])[:4])
	require.Equal(t, c1.ID, strings.Fields(lines[2])[0])

	// A page of one has a cursor, and the cursor gives the other run.
	code, out, errOut = run(t, nil, "runs", "list", "--queue", "c", "--limit", "1", "--json")
	require.Equal(t, 0, code, errOut)
	var page api.RunList
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Runs, 1)
	require.Equal(t, c2.ID, page.Runs[0].ID)
	require.NotEmpty(t, page.NextCursor)
	code, out, errOut = run(t, nil, "runs", "list", "--queue", "c", "--limit", "1", "--cursor", page.NextCursor)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, c1.ID)
	// The table's next-page command repeats the filters with the cursor.
	code, out, errOut = run(t, nil, "runs", "list", "--queue", "c", "--status", "queued", "--limit", "1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "\nnext page: harvest runs list --status queued --queue c --limit 1 --cursor "+page.NextCursor+"\n")

	// runs cancel ends a queued run.
	code, out, errOut = run(t, nil, "runs", "cancel", c1.ID, "--json")
	require.Equal(t, 0, code, errOut)
	var cancelled api.Run
	require.NoError(t, json.Unmarshal([]byte(out), &cancelled), out)
	require.Equal(t, api.StatusCancelled, cancelled.Status)
	code, out, errOut = run(t, nil, "runs", "cancel", c2.ID)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "cancelled")
	code, _, errOut = run(t, nil, "runs", "cancel")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "runs cancel ID")

	// The flood demo with stderr a buffer: results, no progress bar.
	code, out, errOut = run(t, nil, "demo", "flood", "--flood", "5", "--trickle", "1", "--every", "10ms", "--ms", "1", "--queue", "b")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "floods queue")
	for _, s := range []string{out, errOut} {
		require.NotContains(t, s, "\r")
		require.NotContains(t, s, "█")
		require.NotContains(t, s, "flood (last wait")
	}

	cancel()
	require.NoError(t, <-done)
}
