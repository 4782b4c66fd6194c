package neighbour

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// FallbackStep is how far below the fallback priority half of the
// fallback flood's runs go, so that the heavy tenant's own order shows.
const FallbackStep = 10

// drainPoll is how often the heavy tenant's runs are checked for the end
// of the flood.
const drainPoll = 200 * time.Millisecond

// Tenant is one tenant of the benchmark: its name and a client with its
// token.
type Tenant struct {
	Name   string
	Client *client.Client
}

// TenantFromEnv is tenant n of the file `harvest dev --env-file` writes
// (HARVEST_GATEWAY_URL, HARVEST_TENANT_<n>_TOKEN and _NAME).
func TenantFromEnv(n int) (Tenant, error) {
	tok := os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_TOKEN", n))
	name := os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_NAME", n))
	if tok == "" || name == "" {
		return Tenant{}, fmt.Errorf("HARVEST_TENANT_%d_TOKEN or _NAME is not set (source the file of harvest dev --env-file)", n)
	}
	c, err := clientFromEnv(tok)
	return Tenant{Name: name, Client: c}, err
}

// AdminFromEnv is a client with HARVEST_ADMIN_TOKEN.
func AdminFromEnv() (*client.Client, error) {
	tok := os.Getenv("HARVEST_ADMIN_TOKEN")
	if tok == "" {
		return nil, errors.New("HARVEST_ADMIN_TOKEN is not set (source the file of harvest dev --env-file)")
	}
	return clientFromEnv(tok)
}

func clientFromEnv(token string) (*client.Client, error) {
	gw := os.Getenv("HARVEST_GATEWAY_URL")
	if gw == "" {
		return nil, errors.New("HARVEST_GATEWAY_URL is not set (source the file of harvest dev --env-file)")
	}
	return client.New(client.Options{URL: gw, Token: token})
}

// Config describes one run of the benchmark.
type Config struct {
	Heavy, Light Tenant
	// Admin raises the heavy tenant's ceiling; only Raise needs it.
	Admin *client.Client
	Queue string
	// Runs sleep runs of MS milliseconds each make the flood, sent in
	// batch starts of Batch at Priority.
	Runs, MS, Batch int
	Priority        int
	// FallbackPriority is where the flood is sent again, half at it and
	// half FallbackStep below, when no start of the first was accepted.
	FallbackPriority int
	// Every is the light tenant's pace; For how long it keeps it (zero:
	// until the flood drains).
	Every, For time.Duration
	// MaxWait bounds the wait for the flood to drain.
	MaxWait time.Duration
	// Baseline floods at priority 0 instead (an ordinary flood).
	Baseline bool
	// Raise has Admin raise the heavy tenant's ceiling to Priority for the
	// run and clear it afterwards.
	Raise bool
	// Command is the command line, for the report.
	Command  string
	Out, Log io.Writer
}

// Run floods, measures and prints the report on cfg.Out.
func Run(ctx context.Context, cfg Config) (Result, error) {
	res := Result{Command: cfg.Command, Heavy: cfg.Heavy.Name, Light: cfg.Light.Name, Queue: cfg.Queue,
		MS: cfg.MS, Batch: cfg.Batch, Every: cfg.Every, For: cfg.For, HeavyShard: -1, LightShard: -1, LoadStart: loadAvg()}
	if cfg.Raise {
		if _, err := cfg.Admin.SetPriorityCeiling(ctx, cfg.Heavy.Name, cfg.Priority); err != nil {
			return res, fmt.Errorf("neighbour: raise the priority ceiling of %s: %w", cfg.Heavy.Name, err)
		}
		defer func() {
			if _, err := cfg.Admin.ClearPriorityCeiling(context.WithoutCancel(ctx), cfg.Heavy.Name); err != nil {
				logf(cfg.Log, "clearing the priority ceiling of %s: %v", cfg.Heavy.Name, err)
			}
		}()
		p := cfg.Priority
		res.Raised = &p
	}

	prio := cfg.Priority
	if cfg.Baseline {
		prio = 0
	}
	began := time.Now()
	f, ids, err := flood(ctx, cfg, []int{prio})
	res.Floods = append(res.Floods, f)
	if err != nil {
		return res, err
	}
	if f.Accepted == 0 && !cfg.Baseline {
		// As a tenant refused its priority would: send the flood again at
		// the highest priority it may use, ordering its own runs below it.
		began = time.Now()
		f, ids, err = flood(ctx, cfg, []int{cfg.FallbackPriority, cfg.FallbackPriority - FallbackStep})
		res.Floods = append(res.Floods, f)
		if err != nil {
			return res, err
		}
	}
	logf(cfg.Log, "flood in (%d accepted); the light tenant starts", f.Accepted)

	wctx, cancel := context.WithTimeout(ctx, cfg.MaxWait)
	defer cancel()
	drained := make(chan struct{})
	var drainErr error
	var drain time.Duration
	go func() {
		defer close(drained)
		drainErr = waitDrained(wctx, cfg)
		drain = time.Since(began)
	}()
	lightIDs, refused, err := light(ctx, cfg, drained)
	res.LightStarted, res.LightRefused = len(lightIDs)+total(refused), refused
	if err != nil {
		return res, err
	}
	<-drained
	if drainErr != nil {
		return res, fmt.Errorf("neighbour: wait for the flood to drain: %w", drainErr)
	}
	res.Drain = drain
	logf(cfg.Log, "flood drained after %s; reading the runs", round(res.Drain))

	waits := make([]time.Duration, 0, len(lightIDs))
	for _, id := range lightIDs {
		r, err := cfg.Light.Client.Wait(wctx, id, 30*time.Second)
		if err != nil {
			return res, fmt.Errorf("neighbour: read light run %s: %w", id, err)
		}
		if r.ClaimedAt == nil {
			return res, fmt.Errorf("neighbour: light run %s was not claimed (status %s)", id, r.Status)
		}
		waits = append(waits, r.ClaimedAt.Sub(r.CreatedAt.Time))
		res.LightShard = r.Shard
	}
	res.Waits = summarize(waits)

	if len(ids) > 0 {
		claims, shard, err := heavyClaims(wctx, cfg, ids)
		if err != nil {
			return res, err
		}
		res.HeavyShard = shard
		if ps := f.Priorities; len(ps) == 2 {
			o := ownOrder(claims, ps[0], ps[1])
			res.Own = &o
		}
	}
	res.LoadEnd = loadAvg()
	fmt.Fprint(cfg.Out, res.String())
	return res, nil
}

// flood sends the heavy tenant's Runs starts in batches, the i-th at
// prios[i%len(prios)], and returns the accepted runs' priorities by id.
// A refused batch as a whole counts each of its starts under its answer.
func flood(ctx context.Context, cfg Config, prios []int) (Flood, map[string]int, error) {
	f := Flood{Priorities: prios, Refused: map[string]int{}}
	ids := map[string]int{}
	for f.Sent < cfg.Runs {
		reqs := make([]api.StartRequest, min(cfg.Batch, cfg.Runs-f.Sent))
		for i := range reqs {
			var err error
			p := prios[(f.Sent+i)%len(prios)]
			reqs[i], err = client.StartOptions{Priority: p}.Request("sleep", cfg.Queue, map[string]int{"ms": cfg.MS})
			if err != nil {
				return f, ids, err
			}
		}
		f.Sent += len(reqs)
		res, err := cfg.Heavy.Client.StartBatch(ctx, reqs)
		if err != nil {
			key, ok := answer(err)
			if !ok {
				return f, ids, fmt.Errorf("neighbour: flood of %s: %w", cfg.Heavy.Name, err)
			}
			f.Refused[key] += len(reqs)
			continue
		}
		for i, r := range res {
			if r.Error != nil {
				key, _ := answer(r.Error)
				f.Refused[key]++
				continue
			}
			f.Accepted++
			ids[r.Run.ID] = reqs[i].Priority
		}
	}
	logf(cfg.Log, "flood at priority %s: %d accepted of %d", priorities(prios), f.Accepted, f.Sent)
	return f, ids, nil
}

// light starts one plain run of the light tenant every cfg.Every, each in
// its own goroutine so that a slow answer does not slow the pace, until
// cfg.For has passed or, without it, the flood has drained. It returns
// the accepted runs' ids and counts the refusals by answer.
func light(ctx context.Context, cfg Config, drained <-chan struct{}) ([]string, map[string]int, error) {
	var (
		mu      sync.Mutex
		ids     []string
		refused = map[string]int{}
		failed  error
		wg      sync.WaitGroup
	)
	var stop <-chan time.Time
	if cfg.For > 0 {
		stop = time.After(cfg.For)
		drained = nil
	}
	tick := time.NewTicker(cfg.Every)
	defer tick.Stop()
loop:
	for {
		wg.Go(func() {
			s, err := cfg.Light.Client.Start(ctx, "sleep", cfg.Queue, map[string]int{"ms": 0}, client.StartOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ids = append(ids, s.Run.ID)
			} else if key, ok := answer(err); ok {
				refused[key]++
			} else if failed == nil {
				failed = fmt.Errorf("neighbour: start of %s: %w", cfg.Light.Name, err)
			}
		})
		select {
		case <-ctx.Done():
			break loop
		case <-stop:
			break loop
		case <-drained:
			break loop
		case <-tick.C:
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return ids, refused, err
	}
	return ids, refused, failed
}

// waitDrained returns once none of the heavy tenant's runs on the queue is
// queued or running.
func waitDrained(ctx context.Context, cfg Config) error {
	for {
		page, err := cfg.Heavy.Client.List(ctx, client.ListOptions{
			Statuses: []api.Status{api.StatusQueued, api.StatusRunning}, Queue: cfg.Queue, Limit: 1})
		if err != nil {
			return err
		}
		if len(page.Runs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(drainPoll):
		}
	}
}

// heavyClaims lists the heavy tenant's runs, newest first, until it has
// seen every run of ids, and returns their claims and their shard.
func heavyClaims(ctx context.Context, cfg Config, ids map[string]int) ([]claim, int, error) {
	claims := make([]claim, 0, len(ids))
	shard, seen, cursor := -1, 0, ""
	for seen < len(ids) {
		page, err := cfg.Heavy.Client.List(ctx, client.ListOptions{Queue: cfg.Queue, Name: "sleep", Limit: 1000, Cursor: cursor})
		if err != nil {
			return nil, shard, fmt.Errorf("neighbour: list the runs of %s: %w", cfg.Heavy.Name, err)
		}
		for _, r := range page.Runs {
			p, ok := ids[r.ID]
			if !ok {
				continue
			}
			seen++
			shard = r.Shard
			if r.ClaimedAt != nil {
				claims = append(claims, claim{priority: p, created: r.CreatedAt.Time, at: r.ClaimedAt.Time})
			}
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if seen < len(ids) {
		return nil, shard, fmt.Errorf("neighbour: %d of the %d runs of %s's flood are missing from its listing", len(ids)-seen, len(ids), cfg.Heavy.Name)
	}
	return claims, shard, nil
}

// answer names a refusal by its status, code and field, such as
// "403 permission_denied field priority"; false for an error that is not
// the gateway's answer (a transport failure).
func answer(err error) (string, bool) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return "", false
	}
	key := fmt.Sprintf("%d %s", ae.Status, ae.Code)
	if ae.Field != "" {
		key += " field " + ae.Field
	}
	return key, true
}

// loadAvg is the machine's load averages, or "" where /proc has none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "neighbour: "+format+"\n", args...)
	}
}
