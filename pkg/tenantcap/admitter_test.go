package tenantcap_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// gateway is what a test needs of one gateway: its pools (one per shard)
// and its Admitter with its own totals cache.
type gateway struct {
	pools      []*pgxpool.Pool
	committers []*runstore.Committer
	adm        *tenantcap.Admitter
	// before selects the ask-then-write path (AdmitBefore, then
	// runstore.StartTx) instead of the gateway's committer with its hook.
	before bool
}

func newGateway(t *testing.T, urls []string, maxRuns int, cfg tenantcap.Config, tenants []string) *gateway {
	return newGatewayEvery(t, urls, maxRuns, cfg, tenants, time.Hour) // refreshed by hand unless a test runs it
}

// newGatewayEvery is newGateway with totals refreshed every refresh (when
// a test runs their loop).
func newGatewayEvery(t *testing.T, urls []string, maxRuns int, cfg tenantcap.Config, tenants []string, refresh time.Duration) *gateway {
	t.Helper()
	g := &gateway{}
	var dbs []shard.Querier
	for _, u := range urls {
		pool, err := pgxpool.New(context.Background(), u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		g.pools = append(g.pools, pool)
		dbs = append(dbs, pool)
	}
	adm, err := tenantcap.NewAdmitter(tenantcap.AdmitterOptions{
		MaxRuns: maxRuns,
		Config:  func() tenantcap.Config { return cfg },
		Tenants: func() []string { return tenants },
		Totals:  tenantcap.NewTotals(dbs, refresh),
	})
	require.NoError(t, err)
	g.adm = adm
	for i, pool := range g.pools {
		c := runstore.NewCommitter(pool, i, runstore.CommitterOptions{Admitter: adm})
		t.Cleanup(c.Close)
		g.committers = append(g.committers, c)
	}
	require.NoError(t, adm.Totals().Refresh(context.Background()))
	return g
}

// start does what the gateway does with a start: on the tenant's home
// shard, either through the committer whose hook is Admit (the default),
// or, with before set, AdmitBefore and runstore.StartTx in one transaction.
func (g *gateway) start(ctx context.Context, tenant, id string) error {
	home := shards.Home(tenant, len(g.pools))
	req := api.StartRequest{ID: id, Name: "echo", Queue: "shared", Input: json.RawMessage(`{"n":1}`)}
	if verr := req.Validate(); verr != nil {
		return verr
	}
	p := runstore.StartParams{Tenant: tenant, Shard: home, Req: req}
	if !g.before {
		_, err := g.committers[home].Start(ctx, p)
		return err
	}
	tx, err := g.pools[home].Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := g.adm.AdmitBefore(ctx, tx, home, tenant); err != nil {
		return err
	}
	if _, err := runstore.StartTx(ctx, tx, p); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func isOverLimit(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests && ae.RetryAfterMS > 0
}

func count(t *testing.T, db shard.Querier, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func setRunning(t *testing.T, db shard.Querier, counts map[string]int) {
	t.Helper()
	for tenant, n := range counts {
		_, err := db.Exec(context.Background(),
			`INSERT INTO tenant_running (tenant, running) VALUES ($1, $2)
			 ON CONFLICT (tenant) DO UPDATE SET running = excluded.running`, tenant, n)
		require.NoError(t, err)
	}
}

var eightTenants = []string{"t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"}

// The worked examples, decided by Admit against the counts in Postgres.
func TestSpecExamplesAgainstPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testsvc.NewDBURL(t)

	t.Run("static", func(t *testing.T) {
		g := newGateway(t, []string{url}, 128, tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}, eightTenants)
		for i := range 16 {
			require.NoError(t, g.start(ctx, "t1", fmt.Sprintf("s%d", i)))
		}
		err := g.start(ctx, "t1", "s16")
		require.True(t, isOverLimit(err), "%v", err)
		require.Contains(t, err.Error(), "static")
		require.Contains(t, err.Error(), "limit is 16")
		require.Equal(t, 16, count(t, g.pools[0], `SELECT count(*) FROM runs WHERE tenant = 't1'`))
	})

	check := func(t *testing.T, total int, light, heavy bool) {
		db := testsvc.NewDB(t)
		// a light tenant with 1 run, a heavy one with 29, the rest elsewhere
		setRunning(t, db, map[string]int{"light": 1, "heavy": 29, "others": total - 30})
		g := newGateway(t, []string{db.Config().ConnString()}, 128, tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 3}, eightTenants)
		// heavy first: a refusal leaves the counts as they were, so both
		// starts are judged at the example's total
		errHeavy := g.start(ctx, "heavy", "x")
		if !heavy {
			require.Equal(t, total, count(t, db, `SELECT sum(running) FROM tenant_running`))
		}
		errLight := g.start(ctx, "light", "x")
		if light {
			require.NoError(t, errLight)
		} else {
			require.True(t, isOverLimit(errLight), "%v", errLight)
		}
		if heavy {
			require.NoError(t, errHeavy)
		} else {
			require.True(t, isOverLimit(errHeavy), "%v", errHeavy)
			require.Contains(t, errHeavy.Error(), "dynamic")
			require.Contains(t, errHeavy.Error(), "limit is 24")
			require.Contains(t, errHeavy.Error(), "holds 29")
		}
	}
	t.Run("dynamic 32 in flight", func(t *testing.T) { check(t, 32, true, true) })
	t.Run("dynamic 120 in flight", func(t *testing.T) { check(t, 120, true, false) })
}

// Two gateways and 50 concurrent clients of one tenant at its limit: exactly
// the limit gets in, and the refused starts leave no run, task or count.
func TestExactPerTenantRace(t *testing.T) {
	t.Parallel()
	t.Run("committer hook", func(t *testing.T) { t.Parallel(); exactRace(t, false) })
	t.Run("admit before StartTx", func(t *testing.T) { t.Parallel(); exactRace(t, true) })
}

func exactRace(t *testing.T, before bool) {
	ctx := context.Background()
	url := testsvc.NewDBURL(t)
	cfg := tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}
	gws := []*gateway{
		newGateway(t, []string{url}, 128, cfg, eightTenants),
		newGateway(t, []string{url}, 128, cfg, eightTenants),
	}
	gws[0].before, gws[1].before = before, before
	const limit, clients, preloaded = 16, 50, 10
	for i := range preloaded {
		require.NoError(t, gws[0].start(ctx, "t1", fmt.Sprintf("pre-%d", i)))
	}
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		admitted, refused int
		unexpected        []error
		startLine         = make(chan struct{})
	)
	for i := range clients {
		wg.Go(func() {
			<-startLine
			err := gws[i%2].start(ctx, "t1", fmt.Sprintf("race-%d", i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case isOverLimit(err):
				refused++
			default:
				unexpected = append(unexpected, err)
			}
		})
	}
	close(startLine)
	wg.Wait()
	require.Empty(t, unexpected)
	require.Equal(t, limit-preloaded, admitted)
	require.Equal(t, clients-(limit-preloaded), refused)
	db := gws[0].pools[0]
	require.Equal(t, limit, count(t, db, `SELECT count(*) FROM runs WHERE tenant = 't1'`))
	require.Equal(t, limit, count(t, db, `SELECT count(*) FROM tasks x JOIN runs r ON r.pk = x.run_pk WHERE r.tenant = 't1'`))
	require.Equal(t, limit, count(t, db, `SELECT running FROM tenant_running WHERE tenant = 't1'`))
	fixes, err := tenantcap.Recount(ctx, db)
	require.NoError(t, err)
	require.Empty(t, fixes, "the count matches the runs")
}

// Tenants whose home is shard 0 and shard 1 of two.
func homeTenants(t *testing.T) (on0, on1 string) {
	t.Helper()
	for i := 0; on0 == "" || on1 == ""; i++ {
		name := fmt.Sprintf("tenant-%d", i)
		if shards.Home(name, 2) == 0 && on0 == "" {
			on0 = name
		} else if shards.Home(name, 2) == 1 && on1 == "" {
			on1 = name
		}
	}
	return on0, on1
}

// The bound of docs/admission.md: the system limit is overshot by at most
// the starts other shards admitted since this gateway last read their
// totals, and a refresh closes the gap.
func TestSystemLimitOvershootBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	const maxRuns = 10
	cfg := tenantcap.Config{Algorithm: api.AlgorithmNoLimit, TFM: 1}
	a, b := homeTenants(t)
	gw1 := newGateway(t, urls, maxRuns, cfg, []string{a, b}) // starts tenant a, home shard 0
	gw2 := newGateway(t, urls, maxRuns, cfg, []string{a, b}) // starts tenant b, home shard 1

	fill := func(g *gateway, tenant, prefix string, want int) int {
		n := 0
		for i := 0; ; i++ {
			err := g.start(ctx, tenant, fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				require.True(t, isOverLimit(err), "%v", err)
				require.Contains(t, err.Error(), "max_runs=10")
				break
			}
			n++
			require.LessOrEqual(t, n, want, "admitted more than the bound allows")
		}
		return n
	}
	total := func() int {
		return count(t, gw1.pools[0], `SELECT coalesce(sum(running), 0) FROM tenant_running`) +
			count(t, gw1.pools[1], `SELECT coalesce(sum(running), 0) FROM tenant_running`)
	}

	// Six starts on shard 0: its own exact count keeps them under the limit.
	for i := range 6 {
		require.NoError(t, gw1.start(ctx, a, fmt.Sprintf("a-%d", i)))
	}
	// gw2 read shard 0 before those six: it sees 0 there and admits until
	// its own shard alone reaches the limit.
	othersSinceRead := 6
	got := fill(gw2, b, "b", maxRuns)
	require.Equal(t, maxRuns, got)
	require.Equal(t, maxRuns+othersSinceRead, total(), "overshoot equals the other shard's starts since the last read")

	// After a refresh the view is exact again: nothing more gets in on shard 1.
	require.NoError(t, gw2.adm.Totals().Refresh(ctx))
	require.True(t, isOverLimit(gw2.start(ctx, b, "b-late")))

	// gw1 still holds a read of shard 1 from before its ten starts.
	got = fill(gw1, a, "a2", maxRuns-6)
	require.Equal(t, maxRuns-6, got)
	require.LessOrEqual(t, total()-maxRuns, 10+6, "bounded by the starts on the other shard since the read")
	require.NoError(t, gw1.adm.Totals().Refresh(ctx))
	require.True(t, isOverLimit(gw1.start(ctx, a, "a-late")))
}

// With the refresh loop running, a shard filled to the limit is picked up
// by another gateway's next refresh, after which it refuses starts on its
// own shard. (The bound itself is checked deterministically above; this
// test proves the loop closes the gap without a manual refresh.)
func TestRefreshLoopPicksUpOtherShards(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	const maxRuns = 5
	a, b := homeTenants(t)
	gw1 := newGateway(t, urls, maxRuns, tenantcap.DefaultConfig(), nil)
	gw2 := newGatewayEvery(t, urls, maxRuns, tenantcap.DefaultConfig(), nil, 20*time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() { gw2.adm.Totals().Run(ctx, func(err error) { t.Errorf("refresh: %v", err) }) })
	defer wg.Wait()
	defer cancel()

	for i := range maxRuns {
		require.NoError(t, gw1.start(ctx, a, fmt.Sprintf("a-%d", i)))
	}
	require.Eventually(t, func() bool {
		s := gw2.adm.Totals().Snapshot()[0]
		return s.Running == maxRuns && s.Err == nil
	}, 30*time.Second, 5*time.Millisecond, "the refresh loop never read shard 0's new total")
	require.True(t, isOverLimit(gw2.start(ctx, b, "b-after-refresh")))
}

func TestRecountHealsCorruptedCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)
	g := newGateway(t, []string{db.Config().ConnString()}, 128, tenantcap.DefaultConfig(), nil)
	for i := range 3 {
		require.NoError(t, g.start(ctx, "acme", fmt.Sprintf("a-%d", i)))
		require.NoError(t, g.start(ctx, "globex", fmt.Sprintf("g-%d", i)))
	}
	// One of globex's runs finishes, as a worker or a cancel would.
	_, err := runstore.Cancel(ctx, db, "globex", "g-0", 0, "test")
	require.NoError(t, err)
	require.Equal(t, 2, count(t, db, `SELECT running FROM tenant_running WHERE tenant = 'globex'`))

	fixes, err := tenantcap.Recount(ctx, db)
	require.NoError(t, err)
	require.Empty(t, fixes)

	// A crash or a hand edit: wrong counts, a missing row, a stray row.
	_, err = db.Exec(ctx, `UPDATE tenant_running SET running = 99 WHERE tenant = 'acme'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `DELETE FROM tenant_running WHERE tenant = 'globex'`)
	require.NoError(t, err)
	setRunning(t, db, map[string]int{"ghost": 7})

	fixes, err = tenantcap.Recount(ctx, db)
	require.NoError(t, err)
	require.ElementsMatch(t, []tenantcap.Fix{
		{Tenant: "acme", Was: 99, Now: 3},
		{Tenant: "ghost", Was: 7, Now: 0},
		{Tenant: "globex", Now: 2, Created: true},
	}, fixes)
	require.Equal(t, 3, count(t, db, `SELECT running FROM tenant_running WHERE tenant = 'acme'`))
	require.Equal(t, 2, count(t, db, `SELECT running FROM tenant_running WHERE tenant = 'globex'`))
	require.Equal(t, 0, count(t, db, `SELECT running FROM tenant_running WHERE tenant = 'ghost'`))

	fixes, err = tenantcap.Recount(ctx, db)
	require.NoError(t, err)
	require.Empty(t, fixes, "a second recount finds nothing")
}

func TestUsageAndAdmissionView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	a, b := homeTenants(t)
	cfg := tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 2}
	g := newGateway(t, urls, 20, cfg, []string{a, b, "idle"})
	for i := range 3 {
		require.NoError(t, g.start(ctx, a, fmt.Sprintf("a-%d", i)))
	}
	require.NoError(t, g.start(ctx, b, "b-0"))
	require.NoError(t, g.adm.Totals().Refresh(ctx))

	u, err := g.adm.Usage(ctx, g.pools[shards.Home(a, len(g.pools))], shards.Home(a, len(g.pools)), a, nil)
	require.NoError(t, err)
	require.Equal(t, 3, u.Running)
	require.NotNil(t, u.Limit)
	require.Equal(t, 2*(20-4), *u.Limit)

	v, err := tenantcap.BuildAdmissionView(ctx, []shard.Querier{g.pools[0], g.pools[1]}, tenantcap.Current{Config: cfg}, nil, 20, []string{a, b, "idle"})
	require.NoError(t, err)
	require.Equal(t, map[string]int{a: 3, b: 1, "idle": 0}, v.Running)
	require.Equal(t, 4, v.RunningTotal)
	require.Equal(t, 3, v.Tenants)
	require.Equal(t, 32, *v.Limit)

	body, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	for _, k := range []string{"algorithm", "tfm", "max_runs", "max_runs_read_only", "tenants", "running_total", "running", "limit"} {
		require.Contains(t, m, k)
	}
	require.Equal(t, true, m["max_runs_read_only"])

	v, err = tenantcap.BuildAdmissionView(ctx, []shard.Querier{g.pools[0], g.pools[1]}, tenantcap.Current{Config: tenantcap.DefaultConfig()}, nil, 20, nil)
	require.NoError(t, err)
	body, _ = json.Marshal(v)
	require.Contains(t, string(body), `"limit":null`)

	// One shard down: the view says so and still answers.
	dead, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1")
	require.NoError(t, err)
	defer dead.Close()
	v, err = tenantcap.BuildAdmissionView(ctx, []shard.Querier{g.pools[0], dead}, tenantcap.Current{Config: cfg}, nil, 20, nil)
	require.NoError(t, err)
	require.Equal(t, []int{1}, v.UnavailableShards)
}
