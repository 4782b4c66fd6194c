package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// clockSampler reads every queue's fairness clock V (the largest
// last_start among charged keys) on every shard every 100ms and remembers
// any sample lower than the one before it.
type clockSampler struct {
	pools   []*pgxpool.Pool
	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	last    map[string]float64
	samples int
	fell    []string
}

func startClock(pools []*pgxpool.Pool) *clockSampler {
	c := &clockSampler{pools: pools, done: make(chan struct{}), last: map[string]float64{}}
	c.wg.Add(1)
	go c.loop()
	return c
}

func (c *clockSampler) loop() {
	defer c.wg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.sample()
	}
}

func (c *clockSampler) sample() {
	for s, p := range c.pools {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		type clock struct {
			Queue string  `db:"queue"`
			V     float64 `db:"v"`
		}
		got, err := pgrow.All[clock](ctx, p, `SELECT queue, max(last_start) AS v FROM fair_state
			WHERE charged_at IS NOT NULL GROUP BY queue HAVING max(last_start) IS NOT NULL`)
		if err != nil {
			cancel()
			continue
		}
		for _, g := range got {
			q, v := g.Queue, g.V
			k := fmt.Sprintf("shard %d queue %q", s, q)
			c.mu.Lock()
			if prev, ok := c.last[k]; ok && v < prev {
				c.fell = append(c.fell, fmt.Sprintf("%s: V fell from %g to %g", k, prev, v))
			}
			c.last[k] = v
			c.samples++
			c.mu.Unlock()
		}
		cancel()
	}
}

func (c *clockSampler) stop() {
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	c.wg.Wait()
}

func (c *clockSampler) result() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.samples, append([]string(nil), c.fell...)
}

// Report is what Check found.
type Report struct {
	Acked, Replays, Retries int
	Runs                    int
	ByStatus                map[api.Status]int
	Tasks                   int
	MaxAttempt              int
	FencedChecked           int // completed runs whose output names the attempt that made it
	FinalEvents             int
	ClockSamples            int
	TrickleClaims           int
	Violations              []string
	// Notes are things worth a look that break no promise (Postgres
	// deadlocks the processes logged and recovered from, say).
	Notes []string
}

// OK reports whether no invariant was broken.
func (r Report) OK() bool { return len(r.Violations) == 0 }

func (r Report) String() string {
	var b strings.Builder
	statuses := make([]string, 0, len(r.ByStatus))
	for s, n := range r.ByStatus {
		statuses = append(statuses, fmt.Sprintf("%s=%d", s, n))
	}
	sort.Strings(statuses)
	fmt.Fprintf(&b, "acked starts %d (replays %d, retries %d); runs %d [%s]; tasks %d, max attempt %d\n",
		r.Acked, r.Replays, r.Retries, r.Runs, strings.Join(statuses, " "), r.Tasks, r.MaxAttempt)
	fmt.Fprintf(&b, "fenced outputs checked %d; final events heard %d; clock samples %d; trickle claims %d\n",
		r.FencedChecked, r.FinalEvents, r.ClockSamples, r.TrickleClaims)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if r.OK() {
		b.WriteString("invariants: all hold\n")
		return b.String()
	}
	// Group the violations by their first words, so that a flood of one
	// kind does not hide the others.
	fmt.Fprintf(&b, "invariants: %d violation(s)\n", len(r.Violations))
	groups := map[string][]string{}
	var order []string
	for _, v := range r.Violations {
		words := strings.Fields(v)
		k := strings.Join(words[:min(3, len(words))], " ")
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], v)
	}
	for _, k := range order {
		g := groups[k]
		fmt.Fprintf(&b, "  %d × %s ...\n", len(g), k)
		for _, v := range g[:min(3, len(g))] {
			fmt.Fprintf(&b, "    - %s\n", v)
		}
	}
	return b.String()
}

// Drain cancels the runs the trickle quota holds back, then waits until
// no run on any shard is unfinished (or timeout passes).
func (f *Fleet) Drain(ctx context.Context, timeout time.Duration) error {
	for s, p := range f.direct {
		type tid struct {
			Tenant string `db:"tenant"`
			ID     string `db:"id"`
		}
		list, err := pgrow.All[tid](ctx, p, `SELECT tenant, id FROM runs WHERE quota_key = $1 AND status NOT IN ('completed', 'failed', 'cancelled')`, TrickleQuota)
		if err != nil {
			return fmt.Errorf("soak: shard %d: %w", s, err)
		}
		for i, t := range list {
			err := waitFor(ctx, 30*time.Second, func() (bool, error) {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_, err := f.Tenant(t.Tenant, i%f.Gateways()).Cancel(cctx, t.ID)
				var ae *api.Error
				if err == nil || (asAPIError(err, &ae) && ae.Status == 409) {
					return true, nil // cancelled, or finished meanwhile
				}
				return false, nil
			}, "cancel of a trickle run")
			if err != nil {
				return err
			}
		}
	}
	return waitFor(ctx, timeout, func() (bool, error) {
		for _, p := range f.direct {
			var n int
			if err := p.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')`).Scan(&n); err != nil {
				return false, nil
			}
			if n > 0 {
				return false, nil
			}
		}
		return true, nil
	}, "every run to finish")
}

// Check verifies the invariants once the fleet has drained. acks are the
// load's acknowledged starts, problems its wrong answers.
func (f *Fleet) Check(ctx context.Context, acks []Ack, problems []string) Report {
	r := Report{ByStatus: map[api.Status]int{}}
	bad := func(format string, args ...any) { r.Violations = append(r.Violations, fmt.Sprintf(format, args...)) }
	for _, p := range problems {
		bad("wrong answer to a start: %s", p)
	}

	type run struct {
		Status      api.Status `db:"status"`
		Name        string     `db:"name"`
		Attempts    int        `db:"attempts"`
		MaxAttempts int        `db:"max_attempts"`
		Output      []byte     `db:"output"`
		LastAttempt int        `db:"last_attempt"`
		Quota       string     `db:"quota_key"`
	}
	type runRow struct {
		Tenant string `db:"tenant"`
		ID     string `db:"id"`
		run
	}
	runs := map[string]*run{} // tenant/id
	homes := map[string]int{}
	// unread are the shards whose runs could not be read: their acks are
	// not judged one by one (the read error is the violation).
	unread := map[int]bool{}
	if entries, err := directory.List(ctx, f.direct[0]); err != nil {
		bad("read the tenant directory: %v", err)
	} else {
		for _, e := range entries {
			homes[e.Tenant] = e.Shard
			if e.Phase != directory.PhaseHome {
				bad("tenant %s: a move is still in progress (phase %s)", e.Tenant, e.Phase)
			}
		}
	}
	for s, p := range f.direct {
		// The attempt of each run's last task, in one pass over the tasks:
		// a subquery per run (ORDER BY id DESC LIMIT 1) was planned as a
		// backward scan of the whole table for each run, which took
		// minutes once a soak had made a hundred thousand runs.
		read, err := pgrow.All[runRow](ctx, p, `
			WITH last AS (SELECT DISTINCT ON (t.run_pk) t.run_pk, t.attempt FROM tasks t ORDER BY t.run_pk, t.id DESC)
			SELECT r.tenant, r.id, r.status, r.name, r.attempts, r.max_attempts, r.output, r.quota_key,
			       coalesce(l.attempt, 0) AS last_attempt
			FROM runs r LEFT JOIN last l ON l.run_pk = r.pk`)
		if err != nil {
			bad("shard %d: read runs: %v", s, err)
			unread[s] = true
			continue
		}
		for _, rr := range read {
			tenant, id, x := rr.Tenant, rr.ID, &rr.run
			if home, ok := homes[tenant]; !ok {
				bad("run %s/%s is on shard %d, but its tenant has no recorded home", tenant, id, s)
			} else if home != s {
				bad("run %s/%s is on shard %d, its tenant's home is %d", tenant, id, s, home)
			}
			if _, dup := runs[tenant+"/"+id]; dup {
				bad("run %s/%s exists on more than one shard", tenant, id)
			}
			runs[tenant+"/"+id] = x
			r.Runs++
			r.ByStatus[x.Status]++
		}

		// Tasks: attempts within the bound, nothing left in play.
		type taskCounts struct {
			Tasks      int `db:"tasks"`
			MaxAttempt int `db:"max_attempt"`
			Over       int `db:"over"`
			Live       int `db:"live"`
		}
		tc, err := pgrow.One[taskCounts](ctx, p, `
			SELECT count(*) AS tasks, coalesce(max(t.attempt), 0) AS max_attempt,
			       count(*) FILTER (WHERE t.attempt > r.max_attempts) AS over,
			       count(*) FILTER (WHERE t.state <> 'done') AS live
			FROM tasks t JOIN runs r ON r.pk = t.run_pk`)
		if err != nil {
			bad("shard %d: read tasks: %v", s, err)
		} else {
			r.Tasks += tc.Tasks
			r.MaxAttempt = max(r.MaxAttempt, tc.MaxAttempt)
			if tc.Over > 0 {
				bad("shard %d: %d task(s) ran more attempts than their run allows", s, tc.Over)
			}
			if tc.Live > 0 {
				bad("shard %d: %d task(s) still pending or running after every run finished", s, tc.Live)
			}
		}
		var runsOver int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM runs r
			LEFT JOIN (SELECT t.run_pk, count(*) AS n FROM tasks t GROUP BY t.run_pk) c ON c.run_pk = r.pk
			WHERE r.attempts > r.max_attempts * coalesce(c.n, 0)`).Scan(&runsOver); err == nil && runsOver > 0 {
			bad("shard %d: %d run(s) counted more attempts than their tasks allow", s, runsOver)
		}

		// Running counts against the real recount, rolled back.
		if tx, err := p.Begin(ctx); err != nil {
			bad("shard %d: recount: %v", s, err)
		} else {
			fixes, err := tenantcap.RecountTx(ctx, tx)
			_ = tx.Rollback(ctx)
			if err != nil {
				bad("shard %d: recount: %v", s, err)
			}
			for _, fx := range fixes {
				bad("shard %d: tenant %s running count is %d, a recount says %d", s, fx.Tenant, fx.Was, fx.Now)
			}
		}

		// The trickle key: one claim got through its quota; every later
		// claim was refused by the rate recheck. Its charge must date from
		// that one claim, not from a refusal.
		type trickle struct {
			Claims    int        `db:"claims"`
			LastClaim *time.Time `db:"last_claim"`
			Charged   *time.Time `db:"charged_at"`
		}
		tk, err := pgrow.One[trickle](ctx, p, `
			SELECT coalesce(sum(t.attempt), 0) AS claims, max(t.claimed_at) AS last_claim,
			       (SELECT charged_at FROM fair_state WHERE queue = $1 AND key = $2) AS charged_at
			FROM tasks t WHERE t.queue = $1 AND t.fairness_key = $2`, Queue, TrickleKey)
		if err != nil {
			bad("shard %d: read the trickle key: %v", s, err)
		} else {
			lastClaim, charged := tk.LastClaim, tk.Charged
			r.TrickleClaims += tk.Claims
			if charged != nil && (lastClaim == nil || charged.After(lastClaim.Add(time.Second))) {
				bad("shard %d: key %q was charged at %v, after its last claim at %v: a refused recheck charged it", s, TrickleKey, charged, lastClaim)
			}
		}
	}

	for _, a := range acks {
		r.Acked++
		r.Retries += a.Tries - 1
		if !a.Created {
			r.Replays++
		}
		x, ok := runs[a.Tenant+"/"+a.ID]
		if !ok && !unread[a.Shard] {
			bad("acknowledged start %s/%s (%s, shard %d) has no run", a.Tenant, a.ID, a.Via, a.Shard)
			continue
		}
		_ = x
	}
	for k, x := range runs {
		if !x.Status.Final() {
			bad("run %s is %s, not final", k, x.Status)
			continue
		}
		if x.Status != api.StatusCompleted {
			continue
		}
		switch x.Name {
		case "fail":
			var out struct {
				Attempts int `json:"attempts"`
			}
			if json.Unmarshal(x.Output, &out) == nil {
				r.FencedChecked++
				if out.Attempts != x.LastAttempt {
					bad("run %s completed with the output of attempt %d, but attempt %d held the lease: a stale completion was applied", k, out.Attempts, x.LastAttempt)
				}
			}
		case "probe":
			var out ProbeOutput
			if json.Unmarshal(x.Output, &out) == nil {
				r.FencedChecked++
				if out.Attempt != x.LastAttempt {
					bad("run %s completed with the output of attempt %d, but attempt %d held the lease: a stale completion was applied", k, out.Attempt, x.LastAttempt)
				}
			}
		}
	}
	f.evMu.Lock()
	for k, sts := range f.events {
		r.FinalEvents += len(sts)
		if len(sts) > 1 {
			bad("run %s reached a final state %d times: %v", k, len(sts), sts)
		}
		// A run not final in the database is reported above; the fleet
		// may still be finishing it while the check runs.
		if x, ok := runs[k]; ok && len(sts) > 0 && x.Status.Final() && x.Status != sts[0] {
			bad("run %s: event said %s, the database says %s", k, sts[0], x.Status)
		}
	}
	for k, n := range f.probeRun {
		if x, ok := runs[k]; ok && n > x.MaxAttempts {
			bad("probe run %s was executed %d times, its bound is %d attempts", k, n, x.MaxAttempts)
		}
	}
	f.evMu.Unlock()

	if f.clock != nil {
		n, fell := f.clock.result()
		r.ClockSamples = n
		for _, s := range fell {
			bad("fairness clock: %s", s)
		}
	}
	for _, p := range f.Procs() {
		log := p.Log()
		if strings.Contains(log, "janitor fixed running counts") {
			bad("%s: the janitor had to fix running counts (they drifted)", p.Name)
		}
		if strings.Contains(log, "panic:") || strings.Contains(log, "DATA RACE") {
			bad("%s: panic or race in the log", p.Name)
		}
		if n := strings.Count(log, "deadlock detected"); n > 0 {
			r.Notes = append(r.Notes, fmt.Sprintf("%s logged %d Postgres deadlock(s) (retried)", p.Name, n))
		}
	}
	sort.Strings(r.Violations)
	return r
}

func asAPIError(err error, target **api.Error) bool { return errors.As(err, target) }

// Unfinished counts the runs not in a final state over every shard (-1
// when a shard cannot be read).
func (f *Fleet) Unfinished(ctx context.Context) int {
	total := 0
	for _, p := range f.direct {
		var n int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')`).Scan(&n); err != nil {
			return -1
		}
		total += n
	}
	return total
}
