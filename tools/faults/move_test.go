package faults

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// A tenant moves from shard 0 to shard 2 of three while the load floods
// every tenant through two gateways; the move itself is killed halfway
// through its copy, a gateway and the old home's worker are killed and
// brought back, and the move is run again. Afterwards every start a gateway
// acknowledged has exactly one run, on its tenant's recorded home, final;
// each reads back through both gateways with its final status; the
// counts equal a recount; and the load met no wrong answer and gave up
// on no start.
//
// Not parallel: like the other fault tests it checks for leaked
// goroutines, which a fleet of a parallel test would look like.
func TestTenantMovesUnderFlood(t *testing.T) {
	const moved = "acme"
	require.Equal(t, 0, shards.Home(moved, 3), "the test moves a tenant placed on shard 0")
	// The first tenant also starts the trickle, whose claim history the
	// checker reads per shard: it stays put.
	e := setupFleet(t, soak.Options{WorkersPerShard: 1, Tenants: []string{"globex", moved, "initech"}}, 3, soak.LoadOptions{Rate: 40})
	e.moreAcked(150)

	// The first move is killed once it has copied a batch.
	first := e.startMove(moved, 2, "--batch", "10")
	first.waitLine(t, "copy:")
	require.NoError(t, first.cmd.Process.Kill())
	_ = first.cmd.Wait()
	entry, err := directory.Get(e.ctx, e.f.Direct(0), moved)
	require.NoError(t, err)
	require.Equal(t, directory.PhaseCopying, entry.Phase, "killed during the copy")

	// A gateway and the old home's worker die too, and come back.
	e.f.KillGateway(1)
	require.NoError(t, e.f.StartGateway(e.ctx, 1))
	for _, id := range e.f.Workers(0) {
		w := e.f.Worker(id)
		require.NoError(t, w.Signal(syscall.SIGKILL))
		<-w.Done()
		e.f.RetireWorker(id)
	}
	_, err = e.f.AddWorker(0)
	require.NoError(t, err)
	e.moreAcked(50)

	// Run again, it finishes. The killed move's session may hold the move
	// lock until its server process sees the connection gone: a rerun
	// refused for that is tried again.
	for {
		second := e.startMove(moved, 2, "--batch", "10")
		err := second.wait()
		if err != nil && strings.Contains(second.output(), "is already running") && e.ctx.Err() == nil {
			continue
		}
		require.NoError(t, err, "the resumed move:\n%s", second.output())
		break
	}
	entry, err = directory.Get(e.ctx, e.f.Direct(0), moved)
	require.NoError(t, err)
	require.Equal(t, directory.PhaseHome, entry.Phase)
	require.Equal(t, 2, entry.Shard)
	e.moreAcked(100)

	e.finish()
	_, _, retries, giveups := e.load.Stats()
	require.Zero(t, giveups, "no start was given up")
	t.Logf("starts sent again during the test (503s and transport errors): %d", retries)

	// Every acknowledged run of the moved tenant reads back, final,
	// through each gateway.
	for _, a := range e.load.Acked() {
		if a.Tenant != moved {
			continue
		}
		for gw := range e.f.Gateways() {
			run, err := e.f.Tenant(a.Tenant, gw).Get(e.ctx, a.ID)
			require.NoError(t, err, "run %s through gateway %d", a.ID, gw)
			require.True(t, run.Status.Final(), "run %s is %s", a.ID, run.Status)
			require.Equal(t, 2, run.Shard)
		}
	}
}

// moveProc is one `harvest tenants move` process.
type moveProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	line chan string
	done chan struct{}
}

func (e *env) startMove(tenant string, to int, args ...string) *moveProc {
	e.t.Helper()
	cmd := exec.CommandContext(e.ctx, harvestBin, append([]string{"tenants", "move", tenant, "--to", strconv.Itoa(to)}, args...)...)
	cmd.Env = append(cmd.Environ(),
		"HARVEST_SHARDS="+strings.Join(e.f.ShardURLs(), ","),
		"HARVEST_NATS_URL="+e.f.NATSURL(),
		fmt.Sprintf("HARVEST_MAX_RUNS=%d", e.f.MaxRuns()))
	stdout, err := cmd.StdoutPipe()
	require.NoError(e.t, err)
	cmd.Stderr = cmd.Stdout
	p := &moveProc{cmd: cmd, line: make(chan string, 1024), done: make(chan struct{})}
	require.NoError(e.t, cmd.Start())
	go p.read(stdout)
	return p
}

func (p *moveProc) read(r io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		p.mu.Lock()
		p.out.WriteString(sc.Text() + "\n")
		p.mu.Unlock()
		select {
		case p.line <- sc.Text():
		default:
		}
	}
}

// waitLine waits until the process prints a line starting with prefix.
func (p *moveProc) waitLine(t *testing.T, prefix string) {
	t.Helper()
	for {
		select {
		case l := <-p.line:
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return
			}
		case <-p.done:
			t.Fatalf("the move ended before printing %q:\n%s", prefix, p.output())
		}
	}
}

func (p *moveProc) wait() error {
	<-p.done
	return p.cmd.Wait()
}

func (p *moveProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}
