package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// bins are the real binaries, built once per test binary by TestMain.
var bins soak.Binaries

// harvestBin is the harvest command, built with them.
var harvestBin string

func TestMain(m *testing.M) {
	dir, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	bins = soak.Binaries{
		Gateway: soak.Command{Path: filepath.Join(dir, "gateway")},
		Worker:  soak.Command{Path: filepath.Join(dir, "worker")},
	}
	harvestBin = filepath.Join(dir, "harvest")
	testsvc.Main(m)
}

// build compiles cmd/gateway, cmd/worker and cmd/harvest into a directory under the
// temporary directory. testsvc.Main exits the process, so the directory
// cannot be removed afterwards: directories left by earlier runs are
// removed here instead.
func build() (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), "harvest-faults-bin-*"))
	for _, d := range old {
		if st, err := os.Stat(d); err == nil && time.Since(st.ModTime()) > time.Hour {
			_ = os.RemoveAll(d)
		}
	}
	dir, err := os.MkdirTemp("", "harvest-faults-bin-")
	if err != nil {
		return "", err
	}
	// Built in the product's module (the repository's root), with its own
	// dependencies.
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/gateway", "./cmd/worker", "./cmd/harvest")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return dir, nil
}

// env is one fault test's fleet and load.
type env struct {
	t    *testing.T
	ctx  context.Context
	f    *soak.Fleet
	load *soak.Load
}

// setup starts a fleet of 2 shards, 2 gateways and 2 workers per shard and
// a load. Cleanups stop everything and then check that no goroutine of the
// in-process harness (load, observers, proxies, NATS server) leaked.
func setup(t *testing.T, lo soak.LoadOptions) *env {
	t.Helper()
	return setupFleet(t, soak.Options{}, 2, lo)
}

// setupFleet is setup with n shards and the fleet options o (Bins,
// ShardURLs, Dir and Logf are filled in).
func setupFleet(t *testing.T, o soak.Options, n int, lo soak.LoadOptions) *env {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	for range n {
		o.ShardURLs = append(o.ShardURLs, testsvc.NewDBURL(t))
	}
	o.Bins, o.Dir, o.Logf = bins, t.TempDir(), t.Logf
	f, err := soak.Start(ctx, o)
	require.NoError(t, err)
	e := &env{t: t, ctx: ctx, f: f}
	t.Cleanup(func() {
		if e.load != nil {
			e.load.Abort()
		}
		if t.Failed() {
			t.Logf("process logs:\n%s", f.Logs())
		}
		f.Close()
	})
	if lo.Rate == 0 {
		// Modest, so that the fleet keeps up even when other test
		// packages share the two cores.
		lo.Rate = 20
	}
	e.load, err = f.StartLoad(lo)
	require.NoError(t, err)
	return e
}

// acked waits until n more starts than now are acknowledged.
func (e *env) moreAcked(n int) {
	e.t.Helper()
	_, now, _, _ := e.load.Stats()
	require.NoError(e.t, e.load.WaitAcked(e.ctx, now+n))
}

// finish stops the load, drains the fleet and checks the invariants.
// A violation that starts with one of allowed is logged, not failed: the
// caller says in a comment why its fault makes it expected.
func (e *env) finish(allowed ...string) soak.Report {
	e.t.Helper()
	e.load.Stop()
	sent, acked, retries, giveups := e.load.Stats()
	e.t.Logf("load: %d sent, %d acknowledged, %d retries, %d given up", sent, acked, retries, giveups)
	require.NoError(e.t, e.f.Drain(e.ctx, 2*time.Minute))
	if se := e.load.ServerErrors(); len(se) > 0 {
		// A fault may surface as an error the gateway does not class as
		// unavailable (TestClosedConnectionIsUnavailable covered one). The
		// start is sent again and judged by its final answer; the log
		// shows what to classify next.
		e.t.Logf("%d start(s) answered 5xx other than 503, e.g. %s", len(se), se[0])
	}
	rep := e.f.Check(e.ctx, e.load.Acked(), e.load.Problems())
	e.t.Logf("report:\n%s", rep)
	var broken []string
	for _, v := range rep.Violations {
		expected := false
		for _, a := range allowed {
			expected = expected || strings.HasPrefix(v, a)
		}
		if expected {
			e.t.Logf("expected under this fault: %s", v)
			continue
		}
		broken = append(broken, v)
	}
	require.Empty(e.t, broken, "invariants broken:\n%s", strings.Join(broken, "\n"))
	require.Positive(e.t, rep.Acked)
	return rep
}
