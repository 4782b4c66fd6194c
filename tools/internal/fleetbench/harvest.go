package fleetbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"

	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/child"
)

const (
	queue       = "fleet"
	floodKey    = "flood"
	lightKey    = lightTenant // the key binding gives the light tenant's runs
	floodTenant = "flood"
	lightTenant = "light"
)

// proc is a child process with its stderr in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan error
}

func startProc(name, bin string, env []string, logDir string, ready string) (*proc, <-chan struct{}, error) {
	cmd := exec.Command(bin)
	cmd.Env = env
	child.Detach(cmd)
	var logf *os.File
	var err error
	if logDir != "" {
		logf, err = os.Create(filepath.Join(logDir, name+".log"))
		if err != nil {
			return nil, nil, err
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf, done: make(chan error, 1)}
	readyCh := make(chan struct{})
	go func() {
		var once sync.Once
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			if logf != nil {
				fmt.Fprintln(logf, line)
			}
			if ready != "" && strings.Contains(line, ready) {
				once.Do(func() { close(readyCh) })
			}
		}
		p.done <- cmd.Wait()
	}()
	return p, readyCh, nil
}

// stop sends SIGTERM and waits (SIGKILL after the timeout).
func (p *proc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		err = fmt.Errorf("%s did not stop within %s", p.name, timeout)
		<-p.done
	}
	if p.log != nil {
		_ = p.log.Close()
	}
	return err
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// baseEnv is the benchmark's environment without any HARVEST_ or OTEL_
// variable, so that the children see only what the run sets.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "HARVEST_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// FreshDatabase creates a database beside serverURL's and returns its URL
// and a function that drops it.
func FreshDatabase(ctx context.Context, serverURL, prefix string) (string, func() error, error) {
	name := prefix + randomHex(6)
	admin := func(sql string) error {
		// Not ctx: the drop must run after a Ctrl-C too.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(actx, serverURL)
		if err != nil {
			return fmt.Errorf("fleetbench: connect: %w", err)
		}
		defer conn.Close(actx)
		_, err = conn.Exec(actx, sql)
		return err
	}
	if err := admin("CREATE DATABASE " + name + " TEMPLATE template0"); err != nil {
		return "", nil, fmt.Errorf("fleetbench: create database: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() error { return admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") }, nil
}

// fill pre-inserts the flood: one run and one pending task per row, all of
// one tenant and key, as the start path would write them from a start
// with the API's defaults (notify false: no run event). The arrival
// trigger is off for the bulk insert and the key's head is rebuilt once.
func fill(ctx context.Context, db *pgxpool.Pool, n int) error {
	for _, s := range []string{
		`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`,
		fmt.Sprintf(`INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash, status, notify)
			SELECT '%s', 'flood-' || g, 'echo', '%s', '%s', '\x00', 'queued', false FROM generate_series(1, %d) g`,
			floodTenant, queue, floodKey, n),
		fmt.Sprintf(`INSERT INTO tasks (run_pk, queue, fairness_key, state)
			SELECT pk, '%s', '%s', 'pending' FROM runs ORDER BY pk`, queue, floodKey),
		`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`,
		fmt.Sprintf(`SELECT harvest_fair_repair('%s')`, queue),
		fmt.Sprintf(`INSERT INTO tenant_running (tenant, running) VALUES ('%s', %d)`, floodTenant, n),
		`VACUUM ANALYZE runs`,
		`VACUUM ANALYZE tasks`,
		`VACUUM ANALYZE fair_state`,
		`CHECKPOINT`,
	} {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("fill: %.50s: %w", s, err)
		}
	}
	return nil
}

func runHarvest(ctx context.Context, cfg *Config, natsURL string, fair bool, pair int) (Result, error) {
	f := fair
	res := Result{Bench: "fleet", System: "harvest", Fair: &f, Flood: cfg.Flood, Workers: cfg.Workers,
		Slots: cfg.Workers * cfg.Slots, ClaimBatch: cfg.ClaimBatch, LightRate: cfg.LightRate}
	res.Load1[0] = loadAvg()
	janitor := !cfg.NoJanitor
	res.Janitor = &janitor
	dbURL, drop, err := FreshDatabase(ctx, cfg.ServerURL, "harvest_fleet_")
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := drop(); derr != nil {
			cfg.logf("fleet: drop database: %v", derr)
		}
	}()
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = 4
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if _, err := schema.Migrate(ctx, db); err != nil {
		return res, err
	}
	// Time spent per SQL function (pg_stat_user_functions), read after the
	// run: the database side of "where the time goes".
	if _, err := db.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database()); END $$`); err != nil {
		return res, err
	}
	t := time.Now()
	if err := fill(ctx, db, cfg.Flood); err != nil {
		return res, err
	}
	cfg.logf("fleet: %d flood tasks inserted in %s", cfg.Flood, time.Since(t).Round(time.Millisecond))

	tag := fmt.Sprintf("r%d-%s", pair, onOff(fair))
	logDir := ""
	if cfg.OutDir != "" {
		logDir = filepath.Join(cfg.OutDir, "logs")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return res, err
		}
	}

	// The gateway, with the system limit raised explicitly: the flood alone
	// is cfg.Flood unfinished runs.
	port, err := freePort()
	if err != nil {
		return res, err
	}
	gwEnv := append(baseEnv(),
		"HARVEST_SHARDS="+dbURL,
		"HARVEST_NATS_URL="+natsURL,
		"HARVEST_GATEWAY_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"HARVEST_MAX_RUNS="+strconv.Itoa(10*cfg.Flood+1_000_000),
	)
	gw, _, err := startProc("gateway-"+tag, cfg.GatewayBin, gwEnv, logDir, "")
	if err != nil {
		return res, err
	}
	procs := []*proc{gw}
	stopAll := func() {
		for _, p := range procs {
			if err := p.stop(60 * time.Second); err != nil {
				cfg.logf("fleet: %v", err)
			}
		}
		procs = nil
	}
	defer func() { stopAll() }()

	nc, err := natsconn.Connect(natsURL, natsconn.Options{Name: "fleet-light", FailFast: true})
	if err != nil {
		return res, err
	}
	defer nc.Close()
	light, err := client.New(client.Options{NATS: nc, Tenant: lightTenant})
	if err != nil {
		return res, err
	}
	// Wait until the gateway answers a start (on a queue no worker serves).
	probe, err := client.New(client.Options{NATS: nc, Tenant: "probe"})
	if err != nil {
		return res, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, perr := probe.Start(pctx, "echo", "probe", nil, client.StartOptions{})
		cancel()
		if perr == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, fmt.Errorf("gateway not answering: %v", perr)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The workers; the database's cost is counted from before they start.
	costFrom, err := sampleDB(ctx, db)
	if err != nil {
		return res, fmt.Errorf("sample database: %w", err)
	}
	// The workers start from nothing; the gateway has served the light
	// tenant's warm-up since its start.
	appFrom := appCPU(gw.cmd.Process.Pid)
	var readies []<-chan struct{}
	var workers []*proc
	for i := range cfg.Workers {
		env := append(baseEnv(),
			"HARVEST_SHARDS="+dbURL,
			"HARVEST_NATS_URL="+natsURL,
			"HARVEST_WORKER_QUEUES="+queue+":1",
			"HARVEST_WORKER_FAIRNESS_KEYS="+strconv.FormatBool(fair),
			"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS="+strconv.Itoa(cfg.Slots),
			"HARVEST_WORKER_CLAIM_BATCH="+strconv.Itoa(cfg.ClaimBatch),
			"HARVEST_WORKER_BATCH_CLAIMERS="+strconv.Itoa(cfg.Claimers),
			"HARVEST_WORKER_METRICS_ADDR=",
			"HARVEST_WORKER_ID=fleet-"+strconv.Itoa(i),
			"HARVEST_WORKER_JANITOR="+strconv.FormatBool(i == 0 && !cfg.NoJanitor),
			// The benchmark's runs are echo's, a demo workflow, which the
			// stock worker runs only when asked.
			"HARVEST_WORKER_DEMO_HANDLERS=true",
		)
		if cfg.Profile && i == 0 && cfg.OutDir != "" {
			res.Profile = filepath.Join(cfg.OutDir, "cpu-worker-"+tag+".pprof")
			env = append(env, "HARVEST_WORKER_CPU_PROFILE="+res.Profile)
		}
		w, ready, err := startProc(fmt.Sprintf("worker%d-%s", i, tag), cfg.WorkerBin, env, logDir, "worker started")
		if err != nil {
			return res, err
		}
		procs = append(procs, w)
		workers = append(workers, w)
		readies = append(readies, ready)
	}
	for i, r := range readies {
		select {
		case <-r:
		case err := <-workers[i].done:
			workers[i].done <- err
			return res, fmt.Errorf("worker %d exited at start: %v (see its log in %s)", i, err, logDir)
		case <-time.After(60 * time.Second):
			return res, fmt.Errorf("worker %d not ready after 60s", i)
		}
	}
	drainStart := time.Now()

	// The light tenant: from 1 s in, one start every 1/rate, each on its
	// own goroutine so that a slow reply never shifts the schedule.
	lctx, stopLight := context.WithCancel(ctx)
	var (
		lightWG   sync.WaitGroup
		lightErrs atomic.Int64
		firstErr  atomic.Value
		seq       atomic.Int64
	)
	lightWG.Add(1)
	go func() {
		defer lightWG.Done()
		interval := time.Duration(float64(time.Second) / cfg.LightRate)
		next := drainStart.Add(time.Second)
		for {
			select {
			case <-lctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
			n := seq.Add(1)
			lightWG.Add(1)
			go func() {
				defer lightWG.Done()
				sctx, cancel := context.WithTimeout(context.WithoutCancel(lctx), 10*time.Second)
				defer cancel()
				// No key: the gateway binds the run to the key named after
				// its tenant, lightKey (key binding is on by default).
				_, err := light.Start(sctx, "echo", queue, map[string]int64{"seq": n}, client.StartOptions{})
				if err != nil {
					lightErrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}()
			next = next.Add(interval)
		}
	}()

	// Progress, until the flood has drained (or the time runs out).
	var bar *progressbar.ProgressBar
	if cfg.Log != nil {
		bar = progressbar.NewOptions64(int64(cfg.Flood),
			progressbar.OptionSetWriter(cfg.Log),
			progressbar.OptionSetDescription(fmt.Sprintf("harvest fair %-3s", onOff(fair))),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("tasks"),
			progressbar.OptionThrottle(250*time.Millisecond),
			progressbar.OptionSetWidth(30),
			progressbar.OptionClearOnFinish(),
		)
	}
	// What else the server did during the drain, read with the progress:
	// the start of its last checkpoint (each new one kept: one under way
	// when the drain began shows, once ended, with its earlier start) and
	// the end of each analyze of the shard's tables (the janitor's, or
	// anyone's).
	var checkpoints []time.Time
	analyzes := map[time.Time]bool{}
	serverEvents := func() {
		var at time.Time
		var analyzed []time.Time
		if err := db.QueryRow(ctx, `SELECT (SELECT checkpoint_time FROM pg_control_checkpoint()),
			(SELECT coalesce(array_agg(last_analyze), '{}') FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL)`).
			Scan(&at, &analyzed); err != nil {
			return // a role without the right to read them: nothing reported
		}
		if n := len(checkpoints); n == 0 || !at.Equal(checkpoints[n-1]) {
			checkpoints = append(checkpoints, at)
		}
		for _, a := range analyzed {
			analyzes[a] = true
		}
	}
	serverEvents()
	limit := time.After(cfg.MaxDuration)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
poll:
	for {
		select {
		case <-ctx.Done():
			stopLight()
			return res, ctx.Err()
		case <-limit:
			cfg.logf("fleet: -max-duration %s ran out before the flood drained", cfg.MaxDuration)
			break poll
		case <-tick.C:
		}
		// The flood tenant's running count is its unfinished runs: one
		// row to read, whatever the backlog.
		var unfinished int
		err := db.QueryRow(ctx, `SELECT coalesce((SELECT running FROM tenant_running WHERE tenant = $1), 0)`,
			floodTenant).Scan(&unfinished)
		if err != nil {
			stopLight()
			return res, fmt.Errorf("progress: %w", err)
		}
		if bar != nil {
			_ = bar.Set64(int64(cfg.Flood - unfinished))
		}
		serverEvents()
		if unfinished == 0 {
			res.Drained = true
			break
		}
	}
	costTo, err := sampleDB(ctx, db)
	if err != nil {
		stopLight()
		return res, fmt.Errorf("sample database: %w", err)
	}
	appPids := []int{gw.cmd.Process.Pid}
	for _, w := range workers {
		appPids = append(appPids, w.cmd.Process.Pid)
	}
	appTo := appCPU(appPids...)
	if bar != nil {
		_ = bar.Finish()
	}
	stopLight()
	lightWG.Wait()
	// Let the last light starts be claimed before stopping the fleet.
	for range 50 {
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state IN ('pending', 'running') AND queue = $1`, queue).Scan(&left); err != nil || left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, w := range workers {
		res.WorkerRSSMB = append(res.WorkerRSSMB, peakRSS(w.cmd.Process.Pid))
	}
	res.GatewayRSSMB = peakRSS(gw.cmd.Process.Pid)
	stopAll()
	res.Load1[1] = loadAvg()
	res.LightErrors = int(lightErrs.Load())
	if res.LightErrors > 0 {
		cfg.logf("fleet: %d light starts failed, first: %v", res.LightErrors, firstErr.Load())
	}
	if err := figures(ctx, db, &res); err != nil {
		return res, err
	}
	res.Checkpoints = res.light.addEvents(drainStart, checkpoints, analyzes)
	if err := cost(ctx, db, costFrom, costTo, cfg.Flood+res.LightJobs, &res); err != nil {
		return res, fmt.Errorf("database cost: %w", err)
	}
	appCost(appFrom, appTo, cfg.Flood+res.LightJobs, &res)
	if err := functionStats(ctx, db, &res); err != nil {
		cfg.logf("fleet: pg_stat_user_functions: %v", err)
	}
	if cfg.OutDir != "" {
		res.Series = filepath.Join(cfg.OutDir, "keys-"+tag+".json")
		b, _ := json.Marshal(res.perSecond)
		if err := os.WriteFile(res.Series, b, 0o644); err != nil {
			return res, err
		}
		res.LightWaits = filepath.Join(cfg.OutDir, "light-"+tag+".json")
		b, _ = json.MarshalIndent(res.light, "", " ")
		if err := os.WriteFile(res.LightWaits, b, 0o644); err != nil {
			return res, err
		}
	}
	cfg.logf("fleet: harvest fair %s: %.0f tasks/s over %.1f s, light p99 %.1f ms (%d light runs)",
		onOff(fair), res.TasksPerS, res.DrainS, res.LightP99, res.LightJobs)
	return res, nil
}

// figures reads the run's figures from the database, with the definitions
// of bench/river: the drain runs from the first completion to the
// completion of the last flood task; light runs count when they became due
// before its end; waits are due time to claim, nearest-rank percentiles.
func figures(ctx context.Context, db *pgxpool.Pool, res *Result) error {
	type drain struct {
		First *time.Time `db:"first_done"`
		Last  *time.Time `db:"last_flood_done"`
	}
	d, err := pgrow.One[drain](ctx, db, `SELECT
		(SELECT min(finished_at) FROM runs WHERE status = 'completed' AND queue = $1) AS first_done,
		(SELECT max(finished_at) FROM runs WHERE tenant = $2 AND status = 'completed') AS last_flood_done`, queue, floodTenant)
	if err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	t0, t1 := d.First, d.Last
	if t0 == nil || t1 == nil {
		return errors.New("figures: nothing completed")
	}
	var completed int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status = 'completed' AND queue = $1 AND finished_at BETWEEN $2 AND $3`,
		queue, *t0, *t1).Scan(&completed); err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	res.DrainS = round(t1.Sub(*t0).Seconds())
	if res.DrainS > 0 {
		res.TasksPerS = round(float64(completed-1) / t1.Sub(*t0).Seconds())
	}
	lights, err := pgrow.All[lightWait](ctx, db, `SELECT
		extract(epoch FROM t.due_at - $4::timestamptz) AS at_s, extract(epoch FROM t.claimed_at - t.due_at) * 1000 AS wait_ms
		FROM tasks t WHERE t.queue = $1 AND t.fairness_key = $2 AND t.due_at <= $3 AND t.claimed_at IS NOT NULL
		ORDER BY t.due_at`, queue, lightKey, *t1, *t0)
	if err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	waits := make([]float64, 0, len(lights))
	for i := range lights {
		lights[i].AtS, lights[i].WaitMS = round(lights[i].AtS), round(lights[i].WaitMS)
		waits = append(waits, lights[i].WaitMS)
	}
	res.light = lightLog{Light: lights, T0: *t0}
	slices.Sort(waits)
	res.LightJobs = len(waits)
	res.LightP50, res.LightP99 = pct(waits, 50), pct(waits, 99)
	if len(waits) > 0 {
		res.LightMax = round(waits[len(waits)-1])
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE queue = $1 AND fairness_key = $2 AND due_at <= $3 AND claimed_at IS NULL`,
		queue, lightKey, *t1).Scan(&res.LightUnstarted); err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	// Claims per key: over the drain window, and per second since the
	// first claim (for the chart).
	type perSecond struct {
		Key    string `db:"fairness_key"`
		Sec    int    `db:"sec"`
		Claims int    `db:"claims"`
	}
	secs, err := pgrow.All[perSecond](ctx, db, `WITH s AS (SELECT min(claimed_at) AS c0 FROM tasks WHERE queue = $1)
		SELECT t.fairness_key, floor(extract(epoch FROM t.claimed_at - s.c0))::int AS sec, count(*)::int AS claims
		FROM tasks t, s WHERE t.queue = $1 AND t.claimed_at IS NOT NULL
		GROUP BY 1, 2 ORDER BY 1, 2`, queue)
	if err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	res.perSecond = map[string][]int{}
	for _, p := range secs {
		s := res.perSecond[p.Key]
		for len(s) <= p.Sec {
			s = append(s, 0)
		}
		s[p.Sec] = p.Claims
		res.perSecond[p.Key] = s
	}
	type keyClaims struct {
		Key    string `db:"fairness_key"`
		Claims int    `db:"claims"`
	}
	keys, err := pgrow.All[keyClaims](ctx, db, `SELECT fairness_key, count(*)::int AS claims FROM tasks
		WHERE queue = $1 AND claimed_at BETWEEN $2 AND $3 GROUP BY 1 ORDER BY 2 DESC`, queue, *t0, *t1)
	if err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	total := 0
	for _, k := range keys {
		total += k.Claims
		res.Keys = append(res.Keys, KeyShare{Key: k.Key, Claims: k.Claims})
	}
	for i := range res.Keys {
		res.Keys[i].Share = float64(int64(float64(res.Keys[i].Claims)/float64(max(total, 1))*1e6+0.5)) / 1e6
		if res.DrainS > 0 {
			res.Keys[i].PerSec = round(float64(res.Keys[i].Claims) / res.DrainS)
		}
	}
	return nil
}

// lightWait is one light run: when it fell due, in seconds from the
// drain's first completion, and how long it waited for its claim.
type lightWait struct {
	AtS    float64 `json:"at_s" db:"at_s"`
	WaitMS float64 `json:"wait_ms" db:"wait_ms"`
}

// lightLog is the light-waits file of a run: each light run in the order
// it fell due, the start of each checkpoint of the database server during
// the drain and the end of each analyze of the shard's tables, on the
// same clock (a checkpoint's first writes of each page carry the whole
// page into the WAL, so commits just after its start take longer; an
// analyze takes CPU from the drain). The server records a checkpoint's
// start to the second, and the poll sees it once the checkpoint has
// ended: one still running at the drain's end is not listed.
type lightLog struct {
	// T0 is the drain's first completion, the zero of the other times,
	// to line them up with the server's log.
	T0           time.Time   `json:"t0"`
	Light        []lightWait `json:"light"`
	CheckpointsS []float64   `json:"checkpoints_s"`
	// AnalyzesS are the ends of the analyzes of the shard's tables that
	// ended during the drain, as the progress saw them every 200 ms (two
	// analyzes of one table closer than that would show as one).
	AnalyzesS []float64 `json:"analyzes_s"`
}

// addEvents puts on l's clock (seconds from T0) the checkpoints that
// began at or after drainStart (the server keeps a checkpoint's start to
// the second, so the drain's start is too) and the analyzes that ended
// after it (not the fleet's own analyze of the shard before it), each in
// order. It returns the checkpoints kept.
func (l *lightLog) addEvents(drainStart time.Time, checkpoints []time.Time, analyzes map[time.Time]bool) int {
	l.CheckpointsS, l.AnalyzesS = []float64{}, []float64{}
	for _, at := range checkpoints {
		if !at.Before(drainStart.Truncate(time.Second)) {
			l.CheckpointsS = append(l.CheckpointsS, round(at.Sub(l.T0).Seconds()))
		}
	}
	for at := range analyzes {
		if at.After(drainStart) {
			l.AnalyzesS = append(l.AnalyzesS, round(at.Sub(l.T0).Seconds()))
		}
	}
	slices.Sort(l.CheckpointsS)
	slices.Sort(l.AnalyzesS)
	return len(l.CheckpointsS)
}

// pct is the nearest-rank percentile of sorted values.
func pct(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return round(sorted[min(max(i-1, 0), len(sorted)-1)])
}

// FuncStat is one SQL function's share of the database time of a run.
type FuncStat struct {
	Name    string  `json:"name" db:"funcname"`
	Calls   int64   `json:"calls" db:"calls"`
	TotalMS float64 `json:"total_ms" db:"total_time"`
	SelfMS  float64 `json:"self_ms" db:"self_time"`
}

// functionStats reads the most expensive SQL functions of the run (by time
// spent in the function itself) from pg_stat_user_functions. Every
// backend of the run has exited by now, so their counts are flushed.
func functionStats(ctx context.Context, db *pgxpool.Pool, res *Result) error {
	fs, err := pgrow.All[FuncStat](ctx, db, `SELECT funcname::text AS funcname, calls, total_time, self_time
		FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT 8`)
	for i := range fs {
		fs[i].TotalMS, fs[i].SelfMS = round(fs[i].TotalMS), round(fs[i].SelfMS)
	}
	res.Functions = fs
	return err
}
