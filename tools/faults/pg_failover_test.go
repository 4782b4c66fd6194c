package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/pgcluster"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// The failover tests run a shard as a PostgreSQL primary and a streaming
// standby made by the machine's initdb and pg_basebackup, the shard's URL
// naming both servers, and replace the primary in the middle of a flood of
// starts. Nothing restarts a
// gateway or a worker. See docs/operations.md ("Running on highly
// available PostgreSQL") and the results in docs/reliability.md.

// recoverWithin bounds the fleet's recovery after a failover, from the
// moment the primary went away (issue 37's 30 s, generous on purpose: the
// figures are reported, not asserted).
const recoverWithin = 30 * time.Second

// haShard is a shard served by a primary and a streaming standby.
type haShard struct {
	primary, standby *pgcluster.Cluster
	// relay, when set, carries the standby's stream from the primary.
	relay *relay
	// url names both servers, the primary first.
	url string
}

// haOptions shape a haShard.
type haOptions struct {
	synchronous bool
	// relay puts a relay between the standby and the primary, so that the
	// test can hold the stream back.
	relay bool
	// noTarget leaves target_session_attrs out of the URL: the binaries
	// ask for read-write themselves (internal/pgpool).
	noTarget bool
}

// startHAShard starts a primary with a streaming standby and a migrated
// database "harvest" on it.
func startHAShard(t *testing.T, ctx context.Context, o haOptions) *haShard {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL server binaries for a primary and a standby: %v", err)
	}
	// synchronous_commit on, as a durable deployment runs: a commit waits
	// for the local flush, and with a synchronous standby for its flush
	// too (pgcluster turns it off by default).
	opts := pgcluster.Options{MaxConnections: 100, Settings: map[string]string{"synchronous_commit": "on"}}
	primary, err := pgcluster.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	h := &haShard{primary: primary}
	so := pgcluster.StandbyOptions{Synchronous: o.synchronous}
	if o.relay {
		h.relay, err = startRelay(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
		require.NoError(t, err)
		t.Cleanup(h.relay.close)
		so.Upstream = h.relay.addr()
	}
	h.standby, err = primary.StartStandby(ctx, opts, so)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.standby.Stop(context.Background()) })

	admin, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE harvest")
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	db, err := pgx.Connect(ctx, primary.URL("harvest"))
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, db)
	require.NoError(t, err)
	require.NoError(t, db.Close(ctx))
	h.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/harvest?sslmode=disable", primary.Port(), h.standby.Port())
	if !o.noTarget {
		h.url += "&target_session_attrs=read-write"
	}
	return h
}

// catchUp waits until the standby has replayed everything the primary
// has written so far.
func (h *haShard) catchUp(t *testing.T, ctx context.Context) {
	t.Helper()
	primary, err := pgx.Connect(ctx, h.primary.URL("postgres"))
	require.NoError(t, err)
	var lsn string
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn))
	require.NoError(t, primary.Close(ctx))
	standby, err := pgx.Connect(ctx, h.standby.URL("postgres"))
	require.NoError(t, err)
	defer standby.Close(context.Background())
	require.Eventually(t, func() bool {
		var ok bool
		return standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&ok) == nil && ok
	}, time.Minute, 5*time.Millisecond, "the standby replays the primary's WAL")
}

// syncWaiters counts the primary's sessions waiting for the synchronous
// standby to confirm their commit.
func (h *haShard) syncWaiters(ctx context.Context) int {
	c, err := pgx.Connect(ctx, h.primary.URL("postgres"))
	if err != nil {
		return 0
	}
	defer c.Close(context.Background())
	var n int
	if c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n) != nil {
		return 0
	}
	return n
}

// relay forwards a standby's connections to its primary and can hold back
// what the primary sends: the standby then lags, as one across a slow
// link or behind a busy disk does, by as much as the test lets the flood
// write meanwhile.
type relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
	closed bool
	conns  map[net.Conn]bool
}

func startRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]bool{}}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.forward(c)
	}
}

func (r *relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		r.conns[c] = true
	}
	return !r.closed
}

func (r *relay) forward(standby net.Conn) {
	defer r.wg.Done()
	defer standby.Close()
	primary, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer primary.Close()
	if !r.track(standby, primary) {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(primary, standby)
		_ = primary.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := primary.Read(buf)
		if n > 0 {
			// What was read while the relay holds is never sent.
			r.mu.Lock()
			for r.held && !r.closed {
				r.cond.Wait()
			}
			closed := r.closed
			r.mu.Unlock()
			if closed {
				break
			}
			if _, werr := standby.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = standby.Close()
	<-done
}

// hold stops passing on what the primary sends.
func (r *relay) hold() {
	r.mu.Lock()
	r.held = true
	r.mu.Unlock()
}

// close drops what the relay holds, cuts its connections and stops it.
func (r *relay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

// fault is how the primary goes away.
type fault int

const (
	// kill stops the primary at once (pg_ctl stop -m immediate), as the
	// death of its machine would.
	kill fault = iota
	// fence turns the primary read-only and leaves it running, with every
	// session open, as a switchover that demotes the old primary does (or
	// a managed service whose old writer stays up as a reader): pooled
	// connections keep working but every write gets SQLSTATE 25006.
	fence
)

// failover replaces h's primary by its standby: the fault, then the
// promotion once every gateway reports the shard not ready. It returns when
// the fault happened and when the standby was promoted.
func failover(t *testing.T, ctx context.Context, f *soak.Fleet, h *haShard, how fault) (down, promoted time.Time) {
	t.Helper()
	down = breakPrimary(t, ctx, h, how)
	return down, promote(t, ctx, f, h, down)
}

// breakPrimary kills or fences h's primary and returns when.
func breakPrimary(t *testing.T, ctx context.Context, h *haShard, how fault) time.Time {
	t.Helper()
	down := time.Now()
	switch how {
	case kill:
		require.NoError(t, h.primary.Kill(ctx))
	case fence:
		admin, err := pgx.Connect(ctx, h.primary.URL("postgres"))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on")
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
		require.NoError(t, admin.Close(ctx))
	}
	return down
}

// promote waits until every gateway reports shard 0 (h) not ready, as
// nothing takes its writes, then promotes h's standby, as an HA manager
// would once it judged the primary gone.
func promote(t *testing.T, ctx context.Context, f *soak.Fleet, h *haShard, down time.Time) time.Time {
	t.Helper()
	for i := range f.Gateways() {
		require.NoError(t, waitReady(ctx, f, i, false), "gateway %d reports the shard unavailable while it has no primary", i)
	}
	require.NoError(t, h.standby.Promote(ctx))
	// The harness's own pool on the shard (which only reads) may still be
	// on a fenced primary: its checks read the new one.
	f.Direct(0).Reset()
	promoted := time.Now()
	t.Logf("primary gone; every gateway not ready; standby promoted %v later", promoted.Sub(down).Round(time.Millisecond))
	return promoted
}

// waitReady waits until gateway i's /readyz answers 200 (ready) or 503.
func waitReady(ctx context.Context, f *soak.Fleet, i int, ready bool) error {
	want := http.StatusServiceUnavailable
	if ready {
		want = http.StatusOK
	}
	deadline := time.Now().Add(recoverWithin)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.GatewayURL(i)+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := f.HTTPClient().Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway %d: /readyz did not answer %d within %v", i, want, recoverWithin)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recovery is how long after the fault the fleet was whole again.
type recovery struct {
	// start: the first start acknowledged after the fault (gateways).
	start time.Duration
	// finish: that start's run finished (workers claim and complete).
	finish time.Duration
	// ready: every gateway's /readyz said ready again.
	ready time.Duration
}

// measureRecovery sends one start after the fault until it is
// acknowledged, waits for its run to finish and for every gateway to be
// ready, and returns when each happened, counted from down.
func measureRecovery(t *testing.T, ctx context.Context, f *soak.Fleet, down, promoted time.Time) recovery {
	t.Helper()
	var r recovery
	c := f.Tenant(f.Tenants()[0], 0)
	id := fmt.Sprintf("recovery-%d", down.UnixNano())
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.Start(cctx, "echo", soak.Queue, map[string]int{"n": 1}, client.StartOptions{ID: id})
		cancel()
		if err == nil {
			r.start = time.Since(down)
			break
		}
		var ae *api.Error
		require.False(t, errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable, "the recovery start: %v", err)
		require.Less(t, time.Since(down), recoverWithin, "no start acknowledged %v after the fault: %v", recoverWithin, err)
		time.Sleep(20 * time.Millisecond)
	}
	for {
		run, err := c.Get(ctx, id)
		if err == nil && run.Status.Final() {
			require.Equal(t, api.StatusCompleted, run.Status)
			r.finish = time.Since(down)
			break
		}
		require.Less(t, time.Since(down), recoverWithin, "the recovery run did not finish %v after the fault (%v, %v)", recoverWithin, run.Status, err)
		time.Sleep(20 * time.Millisecond)
	}
	for i := range f.Gateways() {
		require.NoError(t, waitReady(ctx, f, i, true))
	}
	r.ready = time.Since(down)
	since := promoted.Sub(down)
	t.Logf("recovery from the fault (from the promotion): first start acknowledged after %v (%v), its run finished after %v (%v), every gateway ready after %v (%v)",
		r.start.Round(time.Millisecond), (r.start - since).Round(time.Millisecond),
		r.finish.Round(time.Millisecond), (r.finish - since).Round(time.Millisecond),
		r.ready.Round(time.Millisecond), (r.ready - since).Round(time.Millisecond))
	return r
}

// setupHA starts a fleet of 2 gateways and 2 workers on the one shard h,
// the binaries dialling h's URL themselves, and a load with probes.
func setupHA(t *testing.T, h *haShard) *env {
	t.Helper()
	return setupFleet(t, soak.Options{ShardURLs: []string{h.url}, Unproxied: true}, 0, soak.LoadOptions{Rate: 40, Probe: true})
}

// noRestart checks that every gateway and worker the fleet started is still
// the same process.
func noRestart(t *testing.T, f *soak.Fleet) {
	t.Helper()
	for _, p := range f.Procs() {
		require.False(t, p.Exited(), "%s exited: %v", p.Name, p.ExitError())
	}
}

// seqOf is the load's number of a start (its id ends with it).
func seqOf(id string) int64 {
	n, _ := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
	return n
}

// lag holds the standby's stream back (after it caught up) while the
// flood goes on, until the primary has sessions waiting for the standby
// (synchronous replication) or 20 starts sent after the hold were
// acknowledged (asynchronous). It returns how many acknowledgements there
// were before the catch-up (each of those starts is on the standby) and
// how many starts had been sent when the hold began.
func lag(t *testing.T, ctx context.Context, e *env, h *haShard) (caughtUp int, sentBefore int64) {
	t.Helper()
	// Counted before catchUp reads the primary's WAL position: a start
	// acknowledged by then was committed (and flushed) before that
	// position, so the standby has it once it has replayed that far. One
	// acknowledged while the standby catches up may have committed after
	// the position read, and the hold below may keep it from the standby.
	caughtUp = len(e.load.Acked())
	h.catchUp(t, ctx)
	h.relay.hold()
	sentBefore, _, _, _ = e.load.Stats()
	deadline := time.Now().Add(recoverWithin)
	for {
		after := 0
		for _, a := range e.load.Acked() {
			if seqOf(a.ID) > sentBefore {
				after++
			}
		}
		waiting := h.syncWaiters(ctx)
		if waiting >= 2 || after >= 20 {
			sent, _, _, _ := e.load.Stats()
			t.Logf("standby held back: %d starts sent since, %d of them acknowledged; %d sessions of the primary wait for the standby",
				sent-sentBefore, after, waiting)
			return caughtUp, sentBefore
		}
		require.True(t, time.Now().Before(deadline), "the flood neither acknowledged starts nor waited for the standby")
		time.Sleep(20 * time.Millisecond)
	}
}

// A shard's primary killed in the middle of a flood, after its synchronous
// standby had fallen behind (its stream held back): the primary could not
// acknowledge a commit the standby lacked, so when the standby is promoted
// every acknowledged start is there and completes exactly once (the check
// finds each acknowledged run, final, finished once, with the output of
// the attempt that held the lease, and running counts equal to a recount),
// no start is answered 500, and the fleet takes starts and finishes runs
// again within 30s, with no process restarted.
func TestShardFailoverSynchronous(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h := startHAShard(t, ctx, haOptions{synchronous: true, relay: true})
	e := setupHA(t, h)
	e.moreAcked(60)
	_, sentBefore := lag(t, ctx, e, h)
	atKill := e.load.Acked()
	// What the relay held is dropped before the kill (a walsender that is
	// writing to a full socket would hold the stop up).
	h.relay.close()
	down := breakPrimary(t, ctx, h, kill)
	promoted := promote(t, ctx, e.f, h, down)
	for _, a := range atKill {
		require.LessOrEqual(t, seqOf(a.ID), sentBefore, "start %s/%s, sent while the standby lagged, was acknowledged by the old primary", a.Tenant, a.ID)
	}
	measureRecovery(t, ctx, e.f, down, promoted)
	e.moreAcked(60)
	noRestart(t, e.f)
	require.Empty(t, e.load.ServerErrors(), "starts answered 5xx other than 503")
	// A fair claim frees the queue's lock at its commit, before its WAL
	// reaches the standby (docs/claim.md), and hands its task out only
	// once it has. The clock sampler may read the charge of a claim that
	// was never handed out and died with the primary: the clock of the new
	// primary is then behind that sample. No acknowledged claim is lost.
	rep := e.finish("fairness clock:")
	late := 0
	for _, a := range e.load.Acked() {
		if seqOf(a.ID) > sentBefore {
			late++
		}
	}
	t.Logf("synchronous replication: %d acknowledged starts, none lost; the old primary acknowledged none of those sent while its standby lagged (the %d sent after the hold were acknowledged after the failover, by the new primary); %d final events heard, none twice",
		rep.Acked, late, rep.FinalEvents)
}

// The same failover over asynchronous replication: the primary goes on
// acknowledging while its standby lags, and those commits die with it.
// Exactly the starts the standby may lack are lost: every start sent
// after its stream was held back and acknowledged is gone, and every
// start acknowledged before it caught up is there. A run whose completion
// was lost runs again, but the shard records one completion: the checks
// on the database (attempts, the output of the attempt that held the
// lease, running counts, no task left in play) all hold. What the run
// events said twice is reported.
func TestShardFailoverAsynchronous(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h := startHAShard(t, ctx, haOptions{relay: true})
	e := setupHA(t, h)
	e.moreAcked(60)
	caughtUp, sentBefore := lag(t, ctx, e, h)
	atKill := len(e.load.Acked())
	h.relay.close()
	down := breakPrimary(t, ctx, h, kill)
	sentAtKill, _, _, _ := e.load.Stats()
	promoted := promote(t, ctx, e.f, h, down)
	measureRecovery(t, ctx, e.f, down, promoted)
	e.moreAcked(60)
	noRestart(t, e.f)
	require.Empty(t, e.load.ServerErrors(), "starts answered 5xx other than 503")

	e.load.Stop()
	acks := e.load.Acked()
	require.NoError(t, e.f.Drain(ctx, 2*time.Minute))
	present := map[string]bool{}
	rows, err := e.f.Direct(0).Query(ctx, "SELECT tenant || '/' || id FROM runs")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, id := range ids {
		present[id] = true
	}
	lost, lagged := 0, 0
	for i, a := range acks {
		k, seq := a.Tenant+"/"+a.ID, seqOf(a.ID)
		if !present[k] {
			lost++
			require.GreaterOrEqual(t, i, caughtUp, "start %s was acknowledged before the standby caught up, and is lost", k)
			require.LessOrEqual(t, seq, sentAtKill, "start %s was sent after the kill (only the new primary could take it), and is lost", k)
		}
		if i < atKill && seq > sentBefore {
			lagged++
			require.False(t, present[k], "start %s was sent after the standby's stream was held and acknowledged by the old primary, yet it is on the new one", k)
		}
	}
	require.Positive(t, lagged, "starts were acknowledged while the standby lagged")

	rep := e.f.Check(ctx, acks, e.load.Problems())
	t.Logf("report:\n%s", rep)
	var doubled int
	for _, v := range rep.Violations {
		switch {
		case strings.HasPrefix(v, "acknowledged start ") && strings.Contains(v, " has no run"):
			// Counted above: each acknowledged by the old primary alone.
		case strings.Contains(v, "reached a final state"), strings.Contains(v, ": event said "):
			// A run whose completion the standby never received ran again:
			// its event was published twice, the shard holds one outcome.
			doubled++
		case strings.HasPrefix(v, "fairness clock:"):
			// Charges of the lost claims were lost with them.
		default:
			t.Errorf("invariant broken: %s", v)
		}
	}
	t.Logf("asynchronous replication: %d acknowledged starts, %d lost, all acknowledged by the old primary after the standby's last catch-up (%d sent after its stream was held and acknowledged, all lost); %d event(s) of a run heard twice, each run recorded once",
		len(acks), lost, lagged, doubled)
}

// A switchover that leaves the old primary running, read-only, with every
// pooled connection still open to it (the case of riverqueue/river#1225):
// each connection's next write gets SQLSTATE 25006. Gateways answer 503,
// not 500; each pool drops its connections to the old primary and opens new
// ones, which target_session_attrs=read-write sends to the new primary;
// workers, janitors and capacity leases carry on without a restart, and
// every acknowledged start completes exactly once.
func TestShardSwitchoverReadOnlyPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h := startHAShard(t, ctx, haOptions{synchronous: true, noTarget: true})
	e := setupHA(t, h)
	e.moreAcked(60)
	down, promoted := failover(t, ctx, e.f, h, fence)
	measureRecovery(t, ctx, e.f, down, promoted)
	e.moreAcked(60)
	noRestart(t, e.f)
	require.Empty(t, e.load.ServerErrors(), "starts answered 5xx other than 503")

	// Nothing of the fleet is left on the old primary: it still runs,
	// read-only, and no gateway or worker holds a session there.
	old, err := pgx.Connect(ctx, h.primary.URL("postgres"))
	require.NoError(t, err)
	defer old.Close(context.Background())
	require.Eventually(t, func() bool {
		var n int
		return old.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = 'harvest' AND application_name <> $1 AND pid <> pg_backend_pid()`, soak.AppName).Scan(&n) == nil && n == 0
	}, recoverWithin, 50*time.Millisecond, "sessions of the fleet stay on the old, read-only primary")
	e.finish()
}

// The system limit stays exact across a switchover of shard 0, which
// holds the capacity ledger: three gateway processes, shard 0 a primary
// with a synchronous standby and shard 1 a plain server. A third of
// HARVEST_MAX_RUNS is taken, then shard 0's primary turns read-only (the
// capacity leases' transfers and the starts get SQLSTATE 25006 on their
// pooled connections) and its standby is promoted while 50 clients press
// past the limit. No worker runs, so admitted runs stay unfinished: at
// most max_runs of them, exactly the admitted ones (a start answered 503
// and sent again is admitted once), and starts sent afterwards fill the
// system to exactly max_runs (capacity held by a transfer the switchover
// interrupted comes back).
func TestSystemLimitExactAcrossShardFailover(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	const maxRuns = 30
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	h := startHAShard(t, ctx, haOptions{synchronous: true})
	f, err := soak.Start(ctx, soak.Options{Bins: bins, ShardURLs: []string{h.url, testsvc.NewDBURL(t)}, Unproxied: true,
		Gateways: 3, NoWorkers: true, MaxRuns: maxRuns, Dir: t.TempDir(), Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs:\n%s", f.Logs())
		}
		f.Close()
	})
	tenants := f.Tenants()
	homes := map[int]bool{}
	for _, tn := range tenants {
		homes[shards.Home(tn, 2)] = true
	}
	require.Len(t, homes, 2, "the tenants live on both shards: %v", tenants)

	// start sends one start until it is answered with anything but 503.
	start := func(c *client.Client, id string) error {
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Start(cctx, "echo", soak.Queue, nil, client.StartOptions{ID: id})
			cancel()
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeUnavailable && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil && !errors.As(err, &ae) && ctx.Err() == nil {
				continue // the answer was lost on the way (a gateway's timeout): send again
			}
			return err
		}
	}
	// A third of the limit is taken before the fault, the rest is pressed
	// for while shard 0 is down and after its standby took over.
	var admitted, refused atomic.Int64
	for i := range maxRuns / 3 {
		require.NoError(t, start(f.Tenant(tenants[i%len(tenants)], i%3), fmt.Sprint("before-", i)))
		admitted.Add(1)
	}
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for c := range 50 {
		cl := f.Tenant(tenants[c%len(tenants)], (c/len(tenants))%3)
		wg.Go(func() {
			<-begin
			for i := range 4 {
				err := start(cl, fmt.Sprintf("c%d-%d", c, i))
				var ae *api.Error
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &ae) && ae.Code == api.CodeOverLimit:
					refused.Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	down := breakPrimary(t, ctx, h, fence)
	close(begin)
	promote(t, ctx, f, h, down)
	wg.Wait()
	t.Logf("%d admitted, %d refused; the clients were answered %v after the kill", admitted.Load(), refused.Load(), time.Since(down).Round(time.Millisecond))
	require.Positive(t, refused.Load(), "the clients pressed past the limit")
	unfinished := func() int {
		n := -1
		require.Eventually(t, func() bool { n = f.Unfinished(ctx); return n >= 0 }, recoverWithin, 20*time.Millisecond)
		return n
	}
	require.LessOrEqual(t, unfinished(), maxRuns)
	require.EqualValues(t, admitted.Load(), unfinished(), "every admitted run is there, once, and nothing else")

	deadline := time.Now().Add(recoverWithin)
	for i := 0; unfinished() < maxRuns; i++ {
		require.True(t, time.Now().Before(deadline), "capacity was lost: %d unfinished", unfinished())
		err := start(f.Tenant(tenants[i%len(tenants)], i%3), fmt.Sprint("fill-", i))
		var ae *api.Error
		if err != nil && (!errors.As(err, &ae) || ae.Code != api.CodeOverLimit) {
			require.NoError(t, err)
		}
		if err != nil {
			time.Sleep(20 * time.Millisecond) // capacity comes back with the leases' next round
		}
	}
	for i := range 3 {
		err := start(f.Tenant(tenants[i], i), fmt.Sprint("over-", i))
		var ae *api.Error
		require.True(t, errors.As(err, &ae) && ae.Code == api.CodeOverLimit, "%v", err)
	}
	require.Equal(t, maxRuns, unfinished())
	noRestart(t, f)
}
