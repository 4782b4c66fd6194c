package cli

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

const demoShareUsage = `demo share|priority [flags]

share: tenant --heavy gets weight --weight on its fairness key (the
gateway binds each tenant's runs to a key named after the tenant), then
both tenants start --runs runs due at the same moment (run_at). Once all
have finished it prints how the claims divided while both tenants had
work: about --weight claims of the heavy tenant for each of the other's.

priority: the admin token raises tenant --heavy's priority ceiling to 10
for the demo (a tenant may not go above the default priority, 0, unless an
operator allows it); that tenant starts --runs runs at priority 10 and the
other tenant --runs at priority 0, all due at the same moment. It prints
how many priority-0 runs were claimed before the last priority-10 one:
none, but for claims in flight together.

Both go through the gateway at HARVEST_GATEWAY_URL with the tokens that
harvest dev --env-file writes (HARVEST_ADMIN_TOKEN, HARVEST_TENANT_<N>_*);
the two tenants must share a home shard (tenants 1 and 2 of harvest dev do).

Flags:`

// demoPriority is the priority of the heavy tenant's runs in the
// priority demo.
const demoPriority = 10

// demoTenant is one tenant of a demo: its name (its bound fairness key)
// and a client with its token.
type demoTenant struct {
	name string
	c    *client.Client
}

func demoTenantOf(n int) (demoTenant, error) {
	gw := os.Getenv("HARVEST_GATEWAY_URL")
	if gw == "" {
		return demoTenant{}, usageError{Msg: "HARVEST_GATEWAY_URL is not set (source the file of harvest dev --env-file)"}
	}
	tok := os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_TOKEN", n))
	name := os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_NAME", n))
	if tok == "" || name == "" {
		return demoTenant{}, usageError{Msg: fmt.Sprintf("HARVEST_TENANT_%d_TOKEN or _NAME is not set (source the file of harvest dev --env-file)", n)}
	}
	c, err := client.New(client.Options{URL: gw, Token: tok})
	return demoTenant{name: name, c: c}, err
}

func runDemoShare(ctx context.Context, e env, mode string, args []string) error {
	fs := newFlags(e, "demo "+mode, demoShareUsage)
	runs := fs.Int("runs", 2000, "runs each tenant starts")
	weight := fs.Float64("weight", 4, "share: the heavy tenant's weight")
	heavyN := fs.Int("heavy", 2, "N of the heavy (share) or high-priority (priority) tenant")
	otherN := fs.Int("other", 1, "N of the other tenant")
	queue := fs.String("queue", "default", "queue of every run")
	lead := fs.Duration("lead", 5*time.Second, "how far ahead the common run_at is set, so that every start lands first")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *runs < 1 || *heavyN == *otherN || *lead <= 0 {
		return usageError{Msg: "--runs must be at least 1, --heavy and --other must differ, --lead must be positive"}
	}
	heavy, err := demoTenantOf(*heavyN)
	if err != nil {
		return err
	}
	other, err := demoTenantOf(*otherN)
	if err != nil {
		return err
	}
	admin, err := client.New(client.Options{URL: os.Getenv("HARVEST_GATEWAY_URL"), Token: os.Getenv("HARVEST_ADMIN_TOKEN")})
	if err != nil {
		return err
	}
	if mode == "priority" {
		// A tenant's starts may carry at most its priority ceiling, the
		// default priority unless an operator raises it: the demo raises
		// the heavy tenant's for its run and puts it back afterwards.
		if _, err := admin.SetPriorityCeiling(ctx, heavy.name, demoPriority); err != nil {
			return apiFailure(err)
		}
		defer func() {
			if _, err := admin.ClearPriorityCeiling(context.WithoutCancel(ctx), heavy.name); err != nil {
				fmt.Fprintf(e.stderr, "clearing the priority ceiling of %s: %v\n", heavy.name, apiFailure(err))
			}
		}()
		fmt.Fprintf(e.stdout, "%s may start runs up to priority %d for this demo; %s keeps the default ceiling, %d.\n",
			heavy.name, demoPriority, other.name, api.DefaultMaxPriority)
	}
	if mode == "share" {
		if _, err := admin.SetWeight(ctx, *queue, heavy.name, *weight); err != nil {
			return apiFailure(err)
		}
		defer func() {
			if _, err := admin.ClearWeight(context.WithoutCancel(ctx), *queue, heavy.name); err != nil {
				fmt.Fprintf(e.stderr, "clearing the weight of %s: %v\n", heavy.name, apiFailure(err))
			}
		}()
		fmt.Fprintf(e.stdout, "%s weighs %g on queue %q; %s weighs 1.\n", heavy.name, *weight, *queue, other.name)
	}
	at := time.Now().Add(*lead)
	heavyPrio := 0
	if mode == "priority" {
		heavyPrio = demoPriority
	}
	for _, s := range []struct {
		t    demoTenant
		prio int
	}{{heavy, heavyPrio}, {other, 0}} {
		if err := demoStartMany(ctx, s.t, *queue, *runs, s.prio, at); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stdout, "%s and %s each started %d runs due at %s; waiting for all of them.\n",
		heavy.name, other.name, *runs, at.Format(time.TimeOnly))

	var claims []demoClaim
	for _, t := range []demoTenant{heavy, other} {
		cs, err := demoClaimsOf(ctx, t, *queue, *runs)
		if err != nil {
			return err
		}
		claims = append(claims, cs...)
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].at.Before(claims[j].at) })
	last := map[string]int{}
	for i, c := range claims {
		last[c.tenant] = i
	}
	switch mode {
	case "share":
		end := min(last[heavy.name], last[other.name])
		n := map[string]int{}
		for _, c := range claims[:end] {
			n[c.tenant]++
		}
		fmt.Fprintf(e.stdout, "While both had work (%d claims): %s %d, %s %d: %.2f claims of %s for each of %s's (weight %g).\n",
			end, heavy.name, n[heavy.name], other.name, n[other.name],
			float64(n[heavy.name])/float64(max(n[other.name], 1)), heavy.name, other.name, *weight)
	case "priority":
		early := 0
		for _, c := range claims[:last[heavy.name]] {
			if c.tenant == other.name {
				early++
			}
		}
		fmt.Fprintf(e.stdout, "Priority-0 runs of %s claimed before the last priority-10 run of %s: %d of %d.\n",
			other.name, heavy.name, early, *runs)
	}
	return nil
}

// demoStartMany starts n sleep runs of 0 ms for tenant t, all due at at.
func demoStartMany(ctx context.Context, t demoTenant, queue string, n, prio int, at time.Time) error {
	for left := n; left > 0; {
		k := min(left, api.MaxBatchItems)
		reqs := make([]api.StartRequest, k)
		for i := range reqs {
			var err error
			if reqs[i], err = (client.StartOptions{Priority: prio, RunAt: at}).Request("sleep", queue, map[string]int{"ms": 0}); err != nil {
				return err
			}
		}
		res, err := t.c.StartBatch(ctx, reqs)
		if err != nil {
			return apiFailure(err)
		}
		for _, r := range res {
			if r.Error != nil {
				return fmt.Errorf("start of %s refused: %d %s: %s", t.name, r.Error.Status, r.Error.Code, r.Error.Message)
			}
		}
		left -= k
	}
	return nil
}

// demoClaim is when one run was first claimed (database clock).
type demoClaim struct {
	tenant string
	at     time.Time
}

// demoClaimsOf waits until tenant t's n newest runs of the queue have all
// finished and returns their first claim times.
func demoClaimsOf(ctx context.Context, t demoTenant, queue string, n int) ([]demoClaim, error) {
	for {
		var out []demoClaim
		waiting := false
		cursor := ""
		for len(out) < n {
			page, err := t.c.List(ctx, client.ListOptions{Queue: queue, Name: "sleep", Limit: 500, Cursor: cursor})
			if err != nil {
				return nil, apiFailure(err)
			}
			for _, r := range page.Runs {
				if len(out) == n {
					break
				}
				if !r.Status.Final() || r.ClaimedAt == nil {
					waiting = true
				} else {
					out = append(out, demoClaim{tenant: t.name, at: r.ClaimedAt.Time})
				}
			}
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
		if !waiting && len(out) == n {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
