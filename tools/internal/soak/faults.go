package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
)

// RunningTasks returns the ids of the tasks worker id holds right now.
func (f *Fleet) RunningTasks(ctx context.Context, id string) ([]int64, error) {
	f.mu.Lock()
	s := f.wShard[id]
	f.mu.Unlock()
	rows, err := f.direct[s].Query(ctx, `SELECT id FROM tasks WHERE claimed_by = $1 AND state = 'running'`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (f *Fleet) waitBusy(ctx context.Context, id string) ([]int64, error) {
	var tasks []int64
	err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		var err error
		tasks, err = f.RunningTasks(ctx, id)
		return len(tasks) > 0, err
	}, "worker "+id+" to hold a task")
	return tasks, err
}

// KillWorkerMidTask waits until worker id holds a task, SIGKILLs it, and
// starts a replacement on the same shard. It returns the tasks the killed
// worker held and the replacement's id.
// The attempts are read while the worker still holds the lease.
func (f *Fleet) KillWorkerMidTask(ctx context.Context, id string) (map[int64]int, string, error) {
	tasks, err := f.waitBusy(ctx, id)
	if err != nil {
		return nil, "", err
	}
	f.mu.Lock()
	s := f.wShard[id]
	f.mu.Unlock()
	held := map[int64]int{}
	for _, t := range tasks {
		a, _, _, err := f.TaskAttempt(ctx, s, t)
		if err != nil {
			return nil, "", err
		}
		held[t] = a
	}
	p := f.Worker(id)
	_ = p.Signal(syscall.SIGKILL)
	<-p.Done()
	f.RetireWorker(id)
	nid, err := f.AddWorker(s)
	return held, nid, err
}

// TaskAttempt returns the current attempt and state of a task on shard s.
func (f *Fleet) TaskAttempt(ctx context.Context, s int, task int64) (int, string, string, error) {
	type taskState struct {
		Attempt   int    `db:"attempt"`
		State     string `db:"state"`
		ClaimedBy string `db:"claimed_by"`
	}
	t, err := pgrow.One[taskState](ctx, f.direct[s],
		`SELECT attempt, state, coalesce(claimed_by, '') AS claimed_by FROM tasks WHERE id = $1`, task)
	return t.Attempt, t.State, t.ClaimedBy, err
}

// PauseWorkerPastLease waits until worker id holds a task, SIGSTOPs it,
// waits until none of those tasks is running under its lease any more,
// then SIGCONTs it. A held task leaves the paused worker in one of two
// ways: its lease runs out, the janitor puts it back and another worker
// claims it again (reclaimed), or a statement the worker had sent before it
// stopped finishes it anyway. It returns the held tasks and how many were
// reclaimed; only a reclaimed task puts the lease fence to the test.
func (f *Fleet) PauseWorkerPastLease(ctx context.Context, id string) ([]int64, int, error) {
	tasks, err := f.waitBusy(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	f.mu.Lock()
	s := f.wShard[id]
	f.mu.Unlock()
	start := map[int64]int{}
	for _, t := range tasks {
		a, _, _, err := f.TaskAttempt(ctx, s, t)
		if err != nil {
			return nil, 0, err
		}
		start[t] = a
	}
	p := f.Worker(id)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return nil, 0, err
	}
	defer func() { _ = p.Signal(syscall.SIGCONT) }()
	reclaimed := 0
	err = waitFor(ctx, time.Minute, func() (bool, error) {
		reclaimed = 0
		for _, t := range tasks {
			a, state, owner, err := f.TaskAttempt(ctx, s, t)
			if err != nil {
				return false, err
			}
			switch {
			case a > start[t] && owner != id:
				reclaimed++
			case state == "done":
			default:
				return false, nil
			}
		}
		return true, nil
	}, "a paused worker's tasks to leave it")
	if err != nil {
		err = fmt.Errorf("%w; held %v (attempts %v); shard %d activity:\n%s", err, tasks, start, s, f.Activity(ctx, s))
	}
	return tasks, reclaimed, err
}

// Activity describes the busy backends of shard s's database (not the
// harness's own): state, wait, blockers, transaction age and query.
func (f *Fleet) Activity(ctx context.Context, s int) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	type backend struct {
		PID      int     `db:"pid"`
		State    string  `db:"state"`
		Wait     string  `db:"wait"`
		Blockers string  `db:"blockers"`
		Age      float64 `db:"age"`
		Query    string  `db:"query"`
	}
	got, err := pgrow.All[backend](ctx, f.direct[s], `
		SELECT pid, state, coalesce(wait_event_type || ':' || wait_event, '') AS wait, pg_blocking_pids(pid)::text AS blockers,
		       coalesce(extract(epoch FROM now() - xact_start), 0)::float8 AS age,
		       left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS query
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND coalesce(application_name, '') <> $1 AND state <> 'idle'
		ORDER BY xact_start NULLS LAST`, AppName)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, g := range got {
		fmt.Fprintf(&b, "  pid %d %s wait=%s blocked-by=%s xact=%.1fs: %s\n", g.PID, g.State, g.Wait, g.Blockers, g.Age, g.Query)
	}
	return b.String()
}

// RestartNATS stops the NATS server, waits down, and starts a new one on
// the same port.
func (f *Fleet) RestartNATS(down time.Duration) error {
	f.StopNATS()
	time.Sleep(down)
	return f.StartNATS()
}

// TerminateBackends ends the server processes of shard s's database that
// are not the harness's own and whose query matches like (all when empty).
// It returns how many it ended.
func (f *Fleet) TerminateBackends(ctx context.Context, s int, like string) (int, error) {
	q := `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
	      WHERE datname = current_database() AND pid <> pg_backend_pid()
	        AND coalesce(application_name, '') <> $1`
	args := []any{AppName}
	if like != "" {
		q += ` AND state <> 'idle' AND query ILIKE $2`
		args = append(args, like)
	}
	var n int
	err := f.direct[s].QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// ShardOutage makes shard s unreachable for down: its proxy refuses new
// connections and cuts the open ones, and the database's backends are
// terminated (as a server stopped in immediate mode would drop them).
func (f *Fleet) ShardOutage(ctx context.Context, s int, down time.Duration) (int, error) {
	p := f.proxies[s]
	p.SetRefuse(true)
	// Terminate first: once the proxy cuts the connections, their
	// backends end by themselves.
	n, err := f.TerminateBackends(ctx, s, "")
	p.CutAll()
	time.Sleep(down)
	p.SetRefuse(false)
	return n, err
}

// TerminateClaimer ends a backend of shard s while it runs a claim (its
// transaction is in progress), retrying for up to 20s until one is caught.
func (f *Fleet) TerminateClaimer(ctx context.Context, s int) (int, error) {
	var total int
	err := waitFor(ctx, 20*time.Second, func() (bool, error) {
		n, err := f.TerminateBackends(ctx, s, "%harvest_claim%")
		total += n
		return total > 0, err
	}, "a claim in progress to terminate")
	return total, err
}

// FlakyShard puts delay on every connection to shard s and cuts all of its
// connections cuts times, pause apart; then the proxy forwards normally.
func (f *Fleet) FlakyShard(s int, delay time.Duration, cuts int, pause time.Duration) int {
	p := f.proxies[s]
	p.SetDelay(delay)
	n := 0
	for range cuts {
		time.Sleep(pause)
		n += p.CutAll()
	}
	time.Sleep(pause)
	p.SetDelay(0)
	return n
}

// WeightsDuringOutage sets a weight override while shard s is unreachable
// (the answer must be 207 with s unavailable), then sends it again once
// the shard is back until it converges (200), and checks that every shard
// reports the same override. It clears the override at the end the same
// way. It returns a short description of what happened.
func (f *Fleet) WeightsDuringOutage(ctx context.Context, s int, key string, weight float64) (string, error) {
	p := f.proxies[s]
	admin := f.Admin(0)
	p.SetRefuse(true)
	p.CutAll()
	res, err := admin.SetWeight(ctx, Queue, key, weight)
	p.SetRefuse(false)
	if err != nil {
		return "", fmt.Errorf("set weight during the outage: %w", err)
	}
	if res.Status() != http.StatusMultiStatus {
		return "", fmt.Errorf("set weight with shard %d down: status %d, want 207: %+v", s, res.Status(), res.Shards)
	}
	for _, o := range res.Shards {
		want := "ok"
		if o.Shard == s {
			want = "unavailable"
		}
		if o.Outcome != want {
			return "", fmt.Errorf("set weight with shard %d down: shard %d outcome %q, want %q", s, o.Shard, o.Outcome, want)
		}
	}
	var tries int
	err = waitFor(ctx, 30*time.Second, func() (bool, error) {
		tries++
		res, err := admin.SetWeight(ctx, Queue, key, weight)
		return err == nil && res.Status() == http.StatusOK, nil
	}, "the weight write to converge")
	if err != nil {
		return "", err
	}
	read, err := admin.GetWeights(ctx, Queue)
	if err != nil {
		return "", err
	}
	found := false
	for _, o := range read.Overrides {
		if o.Key == key && o.Weight == weight {
			found = true
		}
	}
	if !read.WeightsUniform || len(read.UnavailableShards) > 0 || !found {
		return "", fmt.Errorf("after convergence the weights read %+v", read)
	}
	err = waitFor(ctx, 30*time.Second, func() (bool, error) {
		res, err := admin.ClearWeight(ctx, Queue, key)
		return err == nil && res.Status() == http.StatusOK, nil
	}, "the weight clear")
	return fmt.Sprintf("207 with shard %d unavailable, 200 after %d more send(s)", s, tries), err
}

// Fault is one kind of fault the soak can inject at random.
type Fault struct {
	Name string
	Do   func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error)
}

// Faults are the faults the soak picks from.
func Faults() []Fault {
	pickWorker := func(f *Fleet, rnd *rand.Rand) string {
		ws := f.Workers(-1)
		return ws[rnd.IntN(len(ws))]
	}
	return []Fault{
		{"kill a worker mid-task", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			id := pickWorker(f, rnd)
			tasks, nid, err := f.KillWorkerMidTask(ctx, id)
			return fmt.Sprintf("%s held %d task(s); replaced by %s", id, len(tasks), nid), err
		}},
		{"pause a worker past its lease", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			id := pickWorker(f, rnd)
			tasks, reclaimed, err := f.PauseWorkerPastLease(ctx, id)
			return fmt.Sprintf("%s held %d task(s), %d claimed again by others", id, len(tasks), reclaimed), err
		}},
		{"restart NATS", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			return "down 2s", f.RestartNATS(2 * time.Second)
		}},
		{"shard outage", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			s := rnd.IntN(f.Shards())
			n, err := f.ShardOutage(ctx, s, 2*time.Second)
			return fmt.Sprintf("shard %d down 2s, %d backends terminated", s, n), err
		}},
		{"terminate a claimer", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			s := rnd.IntN(f.Shards())
			n, err := f.TerminateClaimer(ctx, s)
			return fmt.Sprintf("shard %d: %d claim backend(s) terminated", s, n), err
		}},
		{"kill a gateway", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			i := rnd.IntN(f.Gateways())
			f.KillGateway(i)
			time.Sleep(time.Second)
			return fmt.Sprintf("gateway %d killed and restarted", i), f.StartGateway(ctx, i)
		}},
		{"weights with a shard down", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			return f.WeightsDuringOutage(ctx, rnd.IntN(f.Shards()), fmt.Sprintf("k%d", rnd.IntN(5)), 2)
		}},
		{"flaky shard", func(ctx context.Context, f *Fleet, rnd *rand.Rand) (string, error) {
			s := rnd.IntN(f.Shards())
			n := f.FlakyShard(s, 20*time.Millisecond, 3, 700*time.Millisecond)
			return fmt.Sprintf("shard %d: 20ms delay, %d connections cut", s, n), nil
		}},
	}
}

// FaultNames lists the soak's faults.
func FaultNames() string {
	var names []string
	for _, f := range Faults() {
		names = append(names, f.Name)
	}
	return strings.Join(names, ", ")
}
