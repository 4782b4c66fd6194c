package soak

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/tools/internal/child"
)

// dbSample is the database's counters at one moment, as the mix reads
// them at each step's ends.
type dbSample struct {
	at time.Time
	// backendCPU is the CPU time the backends of the shard databases have
	// used since the sampler began (the harness's own reads left out);
	// serverCPU that of every postgres process on this machine. Both are
	// meaningful only when local.
	backendCPU, serverCPU time.Duration
	// byApp is backendCPU by the backends' application_name (the
	// binaries name their pools: harvest-gateway, harvest-worker).
	byApp map[string]time.Duration
	local bool
	// wal is the server's WAL position in bytes (every database's WAL);
	// checkpoints the server's checkpoints so far (after each, the first
	// change to a page writes the whole page to the WAL).
	wal, checkpoints int64
	// commits are the shard databases' committed transactions, others
	// those of every other database but the sampler's own, by database
	// (other tests create and drop theirs all the time).
	commits int64
	others  map[uint32]int64
	// statements are what the gateways and workers sent through the
	// fleet's proxies; uncounted the connections the proxies could not
	// read (TLS); kinds the statements by kind.
	statements, uncounted int64
	kinds                 [numKinds]int64
	err                   error
}

// dbDelta is what the database did between two samples.
type dbDelta struct {
	el                    time.Duration
	backendCPU, serverCPU time.Duration
	byApp                 map[string]time.Duration
	local                 bool
	wal, checkpoints      int64
	commits, others       int64
	statements, uncounted int64
	kinds                 [numKinds]int64
	err                   error
}

func (b dbSample) to(a dbSample) dbDelta {
	d := dbDelta{el: a.at.Sub(b.at), backendCPU: a.backendCPU - b.backendCPU, serverCPU: a.serverCPU - b.serverCPU,
		local: a.local && b.local, wal: a.wal - b.wal, checkpoints: a.checkpoints - b.checkpoints, commits: a.commits - b.commits,
		statements: a.statements - b.statements, uncounted: a.uncounted - b.uncounted, err: a.err}
	// A database created since counts whole; one dropped since is lost
	// (its commits after b cannot be read any more).
	for db, n := range a.others {
		d.others += n - b.others[db]
	}
	for i := range d.kinds {
		d.kinds[i] = a.kinds[i] - b.kinds[i]
	}
	d.byApp = make(map[string]time.Duration, len(a.byApp))
	for app, t := range a.byApp {
		d.byApp[app] = t - b.byApp[app]
	}
	if d.err == nil {
		d.err = b.err
	}
	return d
}

// dbSampler reads the server's counters for the shard databases. The
// CPU of their backends is read from /proc/<pid>/stat of each backend
// pg_stat_activity lists for them, every second, so that a backend that
// ends loses at most a second of its time.
type dbSampler struct {
	f     *Fleet
	pool  *pgxpool.Pool
	dbs   []string
	local bool

	mu    sync.Mutex
	last  map[int]time.Duration // backend pid -> CPU at the last reading
	acc   time.Duration
	byApp map[string]time.Duration // acc by application_name

	done chan struct{}
	wg   sync.WaitGroup
}

// newDBSampler connects to serverURL (a database that is none of the
// shards) and starts reading the shard backends' CPU every second. The
// CPU figures are kept only when the server runs on this machine: a
// loopback address and a backend whose /proc entry is a postgres process.
func newDBSampler(ctx context.Context, f *Fleet, serverURL string) (*dbSampler, error) {
	pc, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		return nil, fmt.Errorf("soak: server URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = AppName
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("soak: connect to the server: %w", err)
	}
	s := &dbSampler{f: f, pool: pool, last: map[int]time.Duration{}, byApp: map[string]time.Duration{}, done: make(chan struct{})}
	for _, u := range f.ShardURLs() {
		pu, err := url.Parse(u)
		if err != nil {
			pool.Close()
			return nil, err
		}
		s.dbs = append(s.dbs, strings.TrimPrefix(pu.Path, "/"))
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		pool.Close()
		return nil, fmt.Errorf("soak: server: %w", err)
	}
	s.local = loopback(pc.ConnConfig.Host) && isPostgres(pid)
	s.readBackends(ctx, false)
	s.wg.Add(1)
	go s.loop()
	return s, nil
}

// loopback reports whether host is this machine (or a Unix socket).
func loopback(host string) bool {
	if host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// isPostgres reports whether process pid of this machine is a postgres
// process (a server in another PID namespace would show some other
// process, or none, under its backends' pids).
func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "postgres"
}

func (s *dbSampler) loop() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.readBackends(ctx, true)
		cancel()
	}
}

// readBackends reads the CPU of the shard databases' backends and adds
// what each used since the last reading; a backend seen for the first
// time adds all it used, except at the first reading (count false), which
// only sets the starting point.
func (s *dbSampler) readBackends(ctx context.Context, count bool) {
	if !s.local {
		return
	}
	type backend struct {
		PID int    `db:"pid"`
		App string `db:"app"`
	}
	backends, err := pgrow.All[backend](ctx, s.pool, `SELECT pid, coalesce(application_name, '') AS app
		FROM pg_stat_activity WHERE datname = ANY($1) AND coalesce(application_name, '') <> $2`, s.dbs, AppName)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := make(map[int]time.Duration, len(backends))
	for _, b := range backends {
		t := child.CPU(b.PID)
		if t <= 0 {
			continue
		}
		now[b.PID] = t
		if count {
			d := max(0, t-s.last[b.PID])
			s.acc += d
			s.byApp[b.App] += d
		}
	}
	s.last = now
}

// sample reads every counter now.
func (s *dbSampler) sample(ctx context.Context) dbSample {
	s.readBackends(ctx, true)
	out := dbSample{at: time.Now(), local: s.local}
	s.mu.Lock()
	out.backendCPU = s.acc
	out.byApp = maps.Clone(s.byApp)
	s.mu.Unlock()
	if s.local {
		out.serverCPU = child.PostgresCPU()
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	type counters struct {
		WAL         int64 `db:"wal"`
		Checkpoints int64 `db:"checkpoints"`
		Commits     int64 `db:"commits"`
	}
	c, err := pgrow.One[counters](qctx, s.pool, `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS wal,
		(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) AS checkpoints,
		coalesce(sum(xact_commit) FILTER (WHERE datname = ANY($1)), 0)::bigint AS commits
		FROM pg_stat_database`, s.dbs)
	out.wal, out.checkpoints, out.commits, out.err = c.WAL, c.Checkpoints, c.Commits, err
	if out.err == nil {
		type commits struct {
			ID uint32 `db:"datid"`
			N  int64  `db:"xact_commit"`
		}
		var others []commits
		others, out.err = pgrow.All[commits](qctx, s.pool, `SELECT datid, xact_commit FROM pg_stat_database
			WHERE NOT datname = ANY($1) AND datname <> current_database()`, s.dbs)
		out.others = make(map[uint32]int64, len(others))
		for _, o := range others {
			out.others[o.ID] = o.N
		}
	}
	for _, p := range s.f.proxies {
		n, u := p.Statements()
		out.statements += n
		out.uncounted += u
		for i, k := range p.Kinds() {
			out.kinds[i] += k
		}
	}
	return out
}

// Close stops the sampling.
func (s *dbSampler) Close() {
	close(s.done)
	s.wg.Wait()
	s.pool.Close()
}
