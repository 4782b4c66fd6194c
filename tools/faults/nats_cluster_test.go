package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// A node of a three-node NATS cluster is SIGKILLed under a flood of starts
// over NATS and HTTP, then started again; then a node is hung (SIGSTOP, as
// a machine that died without closing its connections) and resumed. The
// fleet (two gateways, two workers per shard, and a worker that only
// wake-ups can wake) connected while only the first node was up, so every
// one of them was on the node killed. Checked: each process moves to
// another node by itself (no restart) and reports ready; starts over NATS,
// sent by a client on a surviving node, are served again once the
// gateways have moved; a run started after each fault is claimed by the
// wake-up-only worker, whose poll timer (an hour) cannot have fired;
// nodes that come back rejoin the cluster; and, once drained, every
// acknowledged start has exactly one run, completed once (the suite's
// invariants: one run per start, final, the output of the attempt that
// held the lease, at most one final event per run).
//
// Not parallel: like the other fault tests it checks for leaked
// goroutines, which a fleet of a parallel test would look like.
func TestNATSNodeKilledUnderFlood(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)

	cl := newNATSCluster(t, 3)
	victim := cl.nodes[0]
	// Only the victim is up while the fleet connects: every gateway and
	// worker starts on it.
	cl.start(t, victim)

	o := soak.Options{NATSURL: cl.urls(), Bins: bins, Dir: t.TempDir(), Logf: t.Logf}
	for range 2 {
		o.ShardURLs = append(o.ShardURLs, testsvc.NewDBURL(t))
	}
	f, err := soak.Start(ctx, o)
	require.NoError(t, err)
	e := &env{t: t, ctx: ctx, f: f}
	var wake *soak.Proc
	var probes []*natsProbe
	t.Cleanup(func() {
		for _, p := range probes {
			p.stop()
		}
		if e.load != nil {
			e.load.Abort()
		}
		if t.Failed() {
			t.Logf("process logs:\n%s", f.Logs())
			if wake != nil {
				t.Logf("==== wake worker\n%s", wake.Log())
			}
			t.Logf("NATS logs:\n%s", cl.logs())
		}
		if wake != nil {
			_ = wake.Signal(syscall.SIGTERM)
			select {
			case <-wake.Done():
			case <-time.After(10 * time.Second):
				wake.Stop()
			}
		}
		f.Close()
	})

	// The wake-up-only worker serves queue "wake" on the shard of acme,
	// found by a first run it then claims when it starts.
	acme := f.Tenant("acme", 0)
	first := e.start(acme, api.StartRequest{ID: "wake-first", Name: "echo", Queue: wakeQueue, Input: json.RawMessage(`{}`)})
	shard := first.Run.Shard
	metrics := freeLocalAddr(t)
	wake, err = soak.StartProc("wake-worker", bins.Worker, append(cleanEnv(),
		"HARVEST_SHARDS="+strings.Join(f.ShardURLs(), ","),
		"HARVEST_NATS_URL="+cl.urls(),
		fmt.Sprintf("HARVEST_WORKER_SHARD=%d", shard),
		"HARVEST_WORKER_QUEUES="+wakeQueue+":1",
		"HARVEST_WORKER_ID="+wakeWorker,
		"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS=1",
		// Past the test's own timeout: a quick claim can only be a
		// wake-up's (or a dispatch's) doing.
		"HARVEST_WORKER_POLL_INTERVAL=1h",
		"HARVEST_WORKER_DEMO_HANDLERS=true",
		"HARVEST_WORKER_METRICS_ADDR="+metrics,
	))
	require.NoError(t, err)
	e.waitClaimedBy(shard, "wake-first", "the wake worker's first claim at start")
	procs := func() []*soak.Proc { return append(f.Procs(), wake) }

	// The fleet's start waits for the gateways only: a worker started last
	// on a loaded machine may not have connected yet, and once the other
	// nodes are up it could pick one of them. Every process is on the
	// victim before they start.
	require.NoError(t, waitCond(e, func() (bool, error) { return e.missingOn(victim) == "", nil }),
		"every gateway and worker connects to the only node up: %s", e.missingOn(victim))

	cl.start(t, cl.nodes[1])
	cl.start(t, cl.nodes[2])
	cl.waitMesh(t)
	e.load, err = f.StartLoad(soak.LoadOptions{Rate: 60})
	require.NoError(t, err)
	e.moreAcked(60)

	t.Logf("connections on %s before the kill: %v", victim.name, victim.conns(t))
	require.Empty(t, e.missingOn(victim), "every gateway and worker is on the node to kill")

	// Starts over NATS from a client on a surviving node, one every 100ms.
	probe := startNATSProbe(t, cl.nodes[1].url(cl.svcPassword), "acme", "probe-kill")
	probes = append(probes, probe)
	require.NoError(t, waitCond(e, func() (bool, error) { return probe.served(time.Time{}), nil }), "NATS starts are served before the kill")
	e.wakeCheck(shard, "before the kill")

	// 1. The node every process is on dies: its connections close.
	reconnects := countLines(procs(), "NATS reconnected")
	killed := time.Now()
	cl.kill(t, victim)
	require.NoError(t, waitCond(e, func() (bool, error) { return probe.served(killed), nil }), "NATS starts are served again")
	back := probe.firstServedAfter(killed)
	t.Logf("killed %s: NATS starts served again %s after the kill", victim.name, back.Sub(killed).Round(time.Millisecond))
	e.movedOn(procs, reconnects, []*natsNode{cl.nodes[1], cl.nodes[2]}, metrics)
	e.wakeCheck(shard, "after the kill")
	e.moreAcked(60)
	_, lostKill := probe.lastLostAfter(killed.Add(-5 * time.Second))

	// The node comes back and rejoins; starts over NATS keep flowing.
	cl.start(t, victim)
	cl.waitMesh(t)
	natsBefore := e.ackedVia("nats")
	require.NoError(t, waitCond(e, func() (bool, error) { return e.ackedVia("nats") >= natsBefore+10, nil }),
		"NATS starts after the node's return")
	probe.stop()

	// 2. A node some gateway is on hangs: its connections stay open and
	// nothing answers, until pings give up on it (clients and peers).
	var hung *natsNode
	for _, n := range cl.nodes[1:] {
		if n.conns(t)["harvest-gateway"] > 0 {
			hung = n
			break
		}
	}
	require.NotNil(t, hung, "a gateway is on node 2 or 3")
	live := []*natsNode{victim}
	for _, n := range cl.nodes[1:] {
		if n != hung {
			live = append(live, n)
		}
	}
	// The client is on the node that came back, which nobody else is on.
	probe = startNATSProbe(t, victim.url(cl.svcPassword), "acme", "probe-hang")
	probes = append(probes, probe)
	require.NoError(t, waitCond(e, func() (bool, error) { return probe.served(time.Time{}), nil }), "NATS starts are served before the hang")
	hungAt := time.Now()
	require.NoError(t, hung.current().Signal(syscall.SIGSTOP))
	e.movedOn(procs, nil, live, metrics)
	moved := time.Now()
	// Every start sent once everyone has moved is served.
	require.NoError(t, waitCond(e, func() (bool, error) { return probe.served(moved), nil }), "NATS starts are served after the hang")
	// Starts sent to the hung node's stale routes go unanswered until the
	// surviving nodes drop it; then none is lost.
	require.NoError(t, waitCond(e, func() (bool, error) {
		last, _ := probe.lastLostAfter(hungAt)
		return time.Since(last) > 5*time.Second, nil
	}), "NATS starts keep going unanswered after the hang")
	// Wake-ups go to one worker of a queue group; until the surviving
	// nodes drop the hung one, the one chosen may be the wake worker's old
	// subscription behind it, and that wake-up is lost (a worker's poll
	// makes up for it: latency, not a task). Once the probe's starts stop
	// going unanswered, the hung node is out of the cluster's interest.
	e.wakeCheck(shard, "after the hang")
	lastLost, lostHang := probe.lastLostAfter(hungAt)
	hangCost := time.Duration(0)
	if !lastLost.IsZero() {
		hangCost = lastLost.Sub(hungAt)
	}
	t.Logf("hung %s: every process moved after %s; NATS starts went unanswered (%d attempts, sent again) until %s after the hang",
		hung.name, moved.Sub(hungAt).Round(100*time.Millisecond), lostHang, hangCost.Round(100*time.Millisecond))
	require.NoError(t, hung.current().Signal(syscall.SIGCONT))
	cl.waitMesh(t)
	e.moreAcked(60)

	for _, p := range probes {
		p.stop()
	}
	rep := e.finish()
	var acked []string
	for _, p := range probes {
		ids, _ := p.result()
		acked = append(acked, ids...)
	}
	require.NotEmpty(t, acked)
	e.checkCompletedOnce(shard, acked)
	t.Logf("load: %d acknowledged (%d over NATS), %d retries, %d replays; probes: %d NATS starts acknowledged, %d attempts unanswered at the kill",
		rep.Acked, e.ackedVia("nats"), rep.Retries, rep.Replays, len(acked), lostKill)
}

// movedOn waits until every gateway and worker is connected to one of the
// live nodes, with its subscriptions, and reports ready (the wake worker
// on metrics). With reconnects, each must also have logged one more
// reconnect than it says (all of them were on the node that went away).
func (e *env) movedOn(procs func() []*soak.Proc, reconnects map[string]int, live []*natsNode, metrics string) {
	e.t.Helper()
	require.NoError(e.t, waitCond(e, func() (bool, error) {
		return e.onLive(live), nil
	}), "every gateway and worker is on a live node")
	for _, p := range procs() {
		if reconnects != nil && strings.Count(p.Log(), "NATS reconnected") <= reconnects[p.Name] {
			e.t.Errorf("%s is on a live node but logged no reconnect", p.Name)
		}
	}
	for i := range e.f.Gateways() {
		require.NoError(e.t, waitCond(e, func() (bool, error) { return httpStatus(e.f.GatewayURL(i)+"/readyz") == http.StatusOK, nil }),
			"gateway %d ready again", i)
	}
	require.NoError(e.t, waitCond(e, func() (bool, error) { return httpStatus("http://"+metrics+"/readyz") == http.StatusOK, nil }),
		"the wake worker ready again")
}

// missingOn names the first gateway or worker (the wake worker included)
// not connected to node n, or returns "" when every one of them is.
func (e *env) missingOn(n *natsNode) string {
	on := n.conns(e.t)
	if got := on["harvest-gateway"]; got != e.f.Gateways() {
		return fmt.Sprintf("%d of %d gateways", got, e.f.Gateways())
	}
	for _, id := range append(e.f.Workers(-1), wakeWorker) {
		if on["harvest-worker "+id] != 1 {
			return "worker " + id
		}
	}
	return ""
}

// onLive reports whether every gateway and worker (the workers with their
// wake-up and dispatch subscriptions) is connected to one of the live
// nodes.
func (e *env) onLive(live []*natsNode) bool {
	seen := map[string]int{}
	subs := map[string]int{}
	for _, n := range live {
		var cz []connInfo
		if err := n.connzErr(&cz); err != nil {
			return false
		}
		for _, c := range cz {
			seen[c.Name]++
			subs[c.Name] += c.Subs
		}
	}
	if seen["harvest-gateway"] != e.f.Gateways() {
		return false
	}
	for _, id := range append(e.f.Workers(-1), wakeWorker) {
		if seen["harvest-worker "+id] != 1 || subs["harvest-worker "+id] < 2 {
			return false
		}
	}
	return true
}

// countLines counts line in each process's log, by process name.
func countLines(procs []*soak.Proc, line string) map[string]int {
	out := map[string]int{}
	for _, p := range procs {
		out[p.Name] = strings.Count(p.Log(), line)
	}
	return out
}

const (
	wakeQueue  = "wake"
	wakeWorker = "wake-0"
)

// wakeCheck starts a run on the wake worker's queue over HTTP and waits
// until it completes: only a wake-up or a dispatch over NATS can make the
// wake worker claim it before its hour-long poll.
func (e *env) wakeCheck(shard int, when string) {
	e.t.Helper()
	id := "wake-" + strings.ReplaceAll(when, " ", "-")
	st := e.start(e.f.Tenant("acme", 0), api.StartRequest{ID: id, Name: "echo", Queue: wakeQueue, Input: json.RawMessage(`{}`)})
	require.Equal(e.t, shard, st.Run.Shard)
	e.waitClaimedBy(shard, id, "wake-up "+when)
}

// start sends req until it is acknowledged, again with the same id while
// the answer is 429 or 503 (admission still warming up, say), as any
// client would.
func (e *env) start(c *client.Client, req api.StartRequest) client.Started {
	e.t.Helper()
	var st client.Started
	var last error
	require.NoError(e.t, waitCond(e, func() (bool, error) {
		st, last = c.StartRequest(e.ctx, req)
		var ae *api.Error
		if errors.As(last, &ae) && (ae.Status == http.StatusTooManyRequests || ae.Status == http.StatusServiceUnavailable) {
			return false, nil
		}
		return last == nil, last
	}), "start %s (last answer: %v)", req.ID, last)
	return st
}

// waitClaimedBy waits until acme's run id is completed by the wake worker.
func (e *env) waitClaimedBy(shard int, id, what string) {
	e.t.Helper()
	require.NoError(e.t, waitCond(e, func() (bool, error) {
		var status, by string
		err := e.f.Direct(shard).QueryRow(e.ctx, `
			SELECT r.status, coalesce(t.claimed_by, '') FROM runs r JOIN tasks t ON t.run_pk = r.pk
			WHERE r.tenant = 'acme' AND r.id = $1`, id).Scan(&status, &by)
		if err != nil {
			return false, nil
		}
		if status == string(api.StatusCompleted) && by != wakeWorker {
			return false, fmt.Errorf("run %s completed by %q, not the wake worker", id, by)
		}
		return status == string(api.StatusCompleted), nil
	}), what)
}

// checkCompletedOnce checks that each acknowledged probe start has exactly
// one run, on acme's shard, completed.
func (e *env) checkCompletedOnce(shard int, ids []string) {
	e.t.Helper()
	for s := range e.f.Shards() {
		var n int
		require.NoError(e.t, e.f.Direct(s).QueryRow(e.ctx, `SELECT count(*) FROM runs WHERE tenant = 'acme' AND id = ANY($1)`, ids).Scan(&n))
		if s != shard {
			require.Zero(e.t, n, "probe runs on shard %d, not acme's", s)
			continue
		}
		require.Equal(e.t, len(ids), n, "one run per acknowledged probe start")
		var done int
		require.NoError(e.t, e.f.Direct(s).QueryRow(e.ctx, `SELECT count(*) FROM runs WHERE tenant = 'acme' AND id = ANY($1) AND status = 'completed'`, ids).Scan(&done))
		require.Equal(e.t, len(ids), done, "every acknowledged probe start completed")
	}
}

// natsCluster is the test's NATS cluster: nats-server processes, each
// loading a configuration made by natsauth with the same users, routed to
// one another.
type natsCluster struct {
	bin         string
	svcPassword string
	nodes       []*natsNode
}

// natsNode is one node: its addresses, configuration file and process.
type natsNode struct {
	name                  string
	client, cluster, http string
	conf                  string

	mu    sync.Mutex
	proc  *soak.Proc
	older []*soak.Proc // killed earlier (their logs are kept)
}

// natsServerBin is the nats-server program, built once per test binary
// from the version of the module the product depends on.
var natsServerBin struct {
	once sync.Once
	path string
	err  error
}

func natsServerPath(t *testing.T) string {
	t.Helper()
	natsServerBin.once.Do(func() {
		path := filepath.Join(filepath.Dir(bins.Gateway.Path), "nats-server")
		cmd := exec.Command("go", "build", "-o", path, "github.com/nats-io/nats-server/v2")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			natsServerBin.err = fmt.Errorf("go build nats-server: %v\n%s", err, out)
			return
		}
		natsServerBin.path = path
	})
	require.NoError(t, natsServerBin.err)
	return natsServerBin.path
}

// newNATSCluster writes the configuration of n nodes on free local ports;
// it starts none of them.
func newNATSCluster(t *testing.T, n int) *natsCluster {
	t.Helper()
	cl := &natsCluster{bin: natsServerPath(t)}
	var err error
	cl.svcPassword, err = auth.NewSecret()
	require.NoError(t, err)
	routePassword, err := auth.NewSecret()
	require.NoError(t, err)
	var routes []string
	for i := range n {
		node := &natsNode{name: fmt.Sprintf("nats%d", i+1), client: freeLocalAddr(t), cluster: freeLocalAddr(t), http: freeLocalAddr(t)}
		cl.nodes = append(cl.nodes, node)
		routes = append(routes, node.cluster)
	}
	dir := t.TempDir()
	for _, node := range cl.nodes {
		opts := natsauth.Options{
			Comment:  "Node " + node.name + " of the fault suite's NATS cluster.",
			Listen:   node.client,
			HTTP:     node.http,
			Services: []natsauth.User{{Name: "harvest", Password: natsauth.Plain(cl.svcPassword)}},
			// As deploy/nats/nats.conf: a hung node's routes are dropped
			// within about 20s.
			PingInterval: 5 * time.Second, PingMax: 3,
			Cluster: &natsauth.Cluster{Name: "faults", Listen: node.cluster, User: "route",
				Password: natsauth.Plain(routePassword), Routes: routes},
		}
		for _, tenant := range []string{"acme", "globex", "initech"} {
			pw, err := auth.NewSecret()
			require.NoError(t, err)
			opts.Tenants = append(opts.Tenants, natsauth.TenantUser{Name: tenant, Password: natsauth.Plain(pw), Tenant: tenant})
		}
		conf, err := natsauth.Config(opts)
		require.NoError(t, err)
		node.conf = filepath.Join(dir, node.name+".conf")
		require.NoError(t, os.WriteFile(node.conf, []byte(conf), 0o600))
	}
	t.Cleanup(func() {
		for _, node := range cl.nodes {
			if p := node.current(); p != nil {
				p.Stop()
			}
		}
	})
	return cl
}

// urls is the HARVEST_NATS_URL of the cluster: every node, with the
// service user's password.
func (cl *natsCluster) urls() string {
	var out []string
	for _, n := range cl.nodes {
		out = append(out, n.url(cl.svcPassword))
	}
	return strings.Join(out, ",")
}

func (n *natsNode) url(password string) string { return "nats://harvest:" + password + "@" + n.client }

func (n *natsNode) current() *soak.Proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// start starts node n (again) and waits until it answers its health check.
// A port just freed by a killed node may take a moment to be taken again.
func (cl *natsCluster) start(t *testing.T, n *natsNode) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := soak.StartProc(n.name, soak.Command{Path: cl.bin, Args: []string{"-c", n.conf, "--name", n.name}}, cleanEnv())
		require.NoError(t, err)
		n.mu.Lock()
		if n.proc != nil {
			n.older = append(n.older, n.proc)
		}
		n.proc = p
		n.mu.Unlock()
		for !p.Exited() && time.Now().Before(deadline) {
			if httpStatus("http://"+n.http+"/healthz") == http.StatusOK {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.True(t, time.Now().Before(deadline), "%s did not start:\n%s", n.name, p.Log())
		time.Sleep(100 * time.Millisecond) // exited: a port still held
	}
}

// kill SIGKILLs node n and waits for it to exit.
func (cl *natsCluster) kill(t *testing.T, n *natsNode) {
	t.Helper()
	p := n.current()
	require.NoError(t, p.Signal(syscall.SIGKILL))
	<-p.Done()
}

// waitMesh waits until every running node has a route to every other.
func (cl *natsCluster) waitMesh(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range cl.nodes {
			if n.remotes() != len(cl.nodes)-1 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "the NATS nodes did not route to one another")
}

func (cl *natsCluster) logs() string {
	var b strings.Builder
	for _, n := range cl.nodes {
		n.mu.Lock()
		procs := append(append([]*soak.Proc(nil), n.older...), n.proc)
		n.mu.Unlock()
		for _, p := range procs {
			if p != nil {
				fmt.Fprintf(&b, "==== %s (pid %d)\n%s\n", n.name, p.Pid(), p.Log())
			}
		}
	}
	return b.String()
}

// remotes is the number of other nodes node n has a route to (-1 when its
// monitoring does not answer).
func (n *natsNode) remotes() int {
	var rz struct {
		Routes []struct {
			RemoteID string `json:"remote_id"`
		} `json:"routes"`
	}
	if err := getJSON("http://"+n.http+"/routez", &rz); err != nil {
		return -1
	}
	ids := map[string]bool{}
	for _, r := range rz.Routes {
		ids[r.RemoteID] = true
	}
	return len(ids)
}

type connInfo struct {
	Name string `json:"name"`
	Subs int    `json:"subscriptions"`
}

func (n *natsNode) connz(t *testing.T) []connInfo {
	t.Helper()
	var cz []connInfo
	require.NoError(t, n.connzErr(&cz))
	return cz
}

func (n *natsNode) connzErr(out *[]connInfo) error {
	var cz struct {
		Connections []connInfo `json:"connections"`
	}
	if err := getJSON("http://"+n.http+"/connz?limit=1000", &cz); err != nil {
		return err
	}
	*out = cz.Connections
	return nil
}

// conns counts node n's client connections by name.
func (n *natsNode) conns(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, c := range n.connz(t) {
		out[c.Name]++
	}
	return out
}

// natsProbe sends a start over NATS every 100ms, each sent again with the
// same id until it is acknowledged, and notes when each was.
type natsProbe struct {
	nc   *nats.Conn
	c    *client.Client
	done chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	acks   []probeAck
	lostAt []time.Time // when each attempt that got no answer was sent
}

type probeAck struct {
	id         string
	sent, back time.Time // of the attempt that was answered
}

func startNATSProbe(t *testing.T, url, tenant, prefix string) *natsProbe {
	t.Helper()
	nc, err := natsconn.Connect(url, natsconn.Options{Name: "faults-probe", FailFast: true})
	require.NoError(t, err)
	c, err := client.New(client.Options{NATS: nc, Tenant: tenant, NATSTimeout: time.Second})
	require.NoError(t, err)
	p := &natsProbe{nc: nc, c: c, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("%s-%05d", prefix, n)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.one(id)
			}()
		}
	}()
	return p
}

// one sends start id until it is acknowledged or the probe stops (then
// one last try: a start sent is either acknowledged or counted as not).
func (p *natsProbe) one(id string) {
	req := api.StartRequest{ID: id, Name: "echo", Queue: soak.Queue, Input: json.RawMessage(`{}`)}
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := p.c.StartRequest(ctx, req)
		cancel()
		if err == nil {
			p.mu.Lock()
			p.acks = append(p.acks, probeAck{id: id, sent: sent, back: time.Now()})
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.lostAt = append(p.lostAt, sent)
		p.mu.Unlock()
		select {
		case <-p.done:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// served reports whether a start sent after t0 has been acknowledged.
func (p *natsProbe) served(t0 time.Time) bool { return !p.firstServedAfter(t0).IsZero() }

// firstServedAfter is when the first start sent after t0 was acknowledged
// (zero if none was yet).
func (p *natsProbe) firstServedAfter(t0 time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first time.Time
	for _, a := range p.acks {
		if a.sent.After(t0) && (first.IsZero() || a.back.Before(first)) {
			first = a.back
		}
	}
	return first
}

func (p *natsProbe) stop() {
	select {
	case <-p.done:
		return
	default:
		close(p.done)
	}
	p.wg.Wait()
	p.nc.Close()
}

// lastLostAfter is when the last attempt sent after t0 that got no answer
// was sent (zero if none), and how many such attempts there were.
func (p *natsProbe) lastLostAfter(t0 time.Time) (time.Time, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	n := 0
	for _, at := range p.lostAt {
		if at.After(t0) {
			n++
			if at.After(last) {
				last = at
			}
		}
	}
	return last, n
}

// result is the acknowledged ids, sorted, and the unanswered attempts.
func (p *natsProbe) result() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, len(p.acks))
	for i, a := range p.acks {
		ids[i] = a.id
	}
	sort.Strings(ids)
	return ids, len(p.lostAt)
}

// cleanEnv is the environment without the caller's HARVEST_ and OTEL_
// variables, so that a process sees only what the test sets.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HARVEST_") && !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}

// freeLocalAddr is a free address of 127.0.0.1 for a server the test
// starts later, on a port below the kernel's range for port-0 listeners:
// a port that range gave out could go, before the server binds it, to
// another test's port-0 listener (CI saw a worker join another test's
// NATS server there, on the port of a node not yet started).
func freeLocalAddr(t *testing.T) string {
	t.Helper()
	top := 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 12000 {
				top = lo - 1
			}
		}
	}
	for range 100 {
		addr := fmt.Sprintf("127.0.0.1:%d", 10000+mrand.IntN(top-10000))
		if ln, err := net.Listen("tcp", addr); err == nil {
			_ = ln.Close()
			return addr
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

func httpStatus(u string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func getJSON(u string, v any) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", u, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
