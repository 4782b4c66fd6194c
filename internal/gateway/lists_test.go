package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/harvest-run/harvest/pkg/api"
)

// listsRefused reads harvest.gateway.lists.refused, which has no labels.
func listsRefused(t *testing.T) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, metricReader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "harvest.gateway.lists.refused" {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					require.Zero(t, dp.Attributes.Len(), "no labels")
					n += dp.Value
				}
			}
		}
	}
	return n
}

// setupOneList gives a gateway that reads one listing of a tenant at a
// time, a context that ends the test's waits, and entered, which waits
// until a listing of tenant is admitted.
func setupOneList(t *testing.T) (*bundle, context.Context, func(tenant string)) {
	t.Helper()
	b := setup(t, setupOpts{Tune: func(c *Config) { c.MaxListsPerTenant = 1 }})
	b.gw.lists.entered.Init()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	t.Cleanup(cancel)
	return b, ctx, func(tenant string) {
		t.Helper()
		_, err := b.gw.lists.entered.WaitFor(ctx, func(got string) bool { return got == tenant })
		require.NoError(t, err, "a listing of %s admitted", tenant)
	}
}

// requireNoListsLeft checks that every listing admitted has left.
func (b *bundle) requireNoListsLeft(t *testing.T) {
	t.Helper()
	b.gw.lists.mu.Lock()
	left := len(b.gw.lists.byTenant)
	b.gw.lists.mu.Unlock()
	require.Zero(t, left, "no listing left in flight")
}

// lockRuns locks the runs table of every shard, so that a listing waits
// there as a long read of a big history would, until release.
func (b *bundle) lockRuns(ctx context.Context, t *testing.T) (release func()) {
	t.Helper()
	return b.lockTable(ctx, t, "runs")
}

// lockTable locks table on every shard, so that a read of it waits there
// until release.
func (b *bundle) lockTable(ctx context.Context, t *testing.T, table string) (release func()) {
	t.Helper()
	var locks []pgx.Tx
	for _, db := range b.dbs {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // a no-op once released
		_, err = tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{table}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		locks = append(locks, tx)
	}
	return func() {
		for _, tx := range locks {
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

// A tenant's run listings are bounded on each gateway: past
// HARVEST_GATEWAY_MAX_LISTS_PER_TENANT in flight the next one is answered
// 429 with Retry-After at once, while another tenant's is read as usual,
// and the slot is the tenant's again once its listing is answered. The
// listings are held on the shards by a lock on runs, as a long read of a
// big history would hold them.
func TestListsBoundedPerTenant(t *testing.T) {
	t.Parallel()
	b, ctx, entered := setupOneList(t)
	release := b.lockRuns(ctx, t)

	heldA := b.getInBackground(secretA, "/v1/runs?status=failed")
	entered(tenantOn[0])
	refusedBefore := listsRefused(t)
	status, body := b.call(t, http.MethodGet, "/v1/runs", secretA, nil)
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	require.Greater(t, listsRefused(t), refusedBefore, "the refusal is counted")
	e := apiErr(t, body)
	require.Equal(t, api.CodeOverLimit, e.Code)
	require.Equal(t, int64(1000), e.RetryAfterMS)
	require.Contains(t, e.Message, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT")

	// The other tenant is admitted (and waits on the lock like the first).
	heldB := b.getInBackground(secretB, "/v1/runs")
	entered(tenantOn[1])

	release()
	for _, held := range []<-chan waitAnswer{heldA, heldB} {
		a := <-held
		require.Equal(t, http.StatusOK, a.status, string(a.body))
	}
	status, body = b.call(t, http.MethodGet, "/v1/runs", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	b.requireNoListsLeft(t)
}

// A tenant's session of the console shares the tenant's bound: while its
// API listing is held on the shards, its runs page is answered 429 with
// the reason; an operator's runs page is not bounded.
func TestConsoleRunsPageSharesTheTenantsListBound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: consoleTokens(t), Tune: func(c *Config) { c.MaxListsPerTenant = 1 }})
	b.gw.lists.entered.Init()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	tenantBr, _ := signIn(t, b, consoleAcme)
	rootBr, _ := signIn(t, b, consoleRoot)
	release := b.lockRuns(ctx, t)
	held := b.getInBackground(consoleAcme, "/v1/runs")
	_, err := b.gw.lists.entered.WaitFor(ctx, func(got string) bool { return got == "acme" })
	require.NoError(t, err)

	status, page := tenantBr.get("/admin/runs")
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Contains(t, page, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT")
	// The operator's page of the same tenant's runs is read (it waits on
	// the lock like the API listing), not refused.
	lockWaiters := func() int {
		n := 0
		for _, db := range b.dbs {
			var k int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&k))
			n += k
		}
		return n
	}
	before := lockWaiters()
	rootStatus := make(chan int, 1)
	go func() {
		resp, err := rootBr.hc.Get(rootBr.base + "/admin/runs?tenant=acme")
		if err != nil {
			rootStatus <- 0
			return
		}
		resp.Body.Close()
		rootStatus <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return lockWaiters() > before }, 30*time.Second, 10*time.Millisecond,
		"the operator's listing reached the shards")

	release()
	a := <-held
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, http.StatusOK, <-rootStatus)
	status, page = tenantBr.get("/admin/runs")
	require.Equal(t, http.StatusOK, status, page)
}

// A tenant's per-key view of a queue counts the queue's pending tasks, a
// read that grows with the backlog, so it shares the tenant's bound of
// listings in flight: while the tenant's view is held on the shards, its
// next view and its run listing are answered 429; another tenant's
// listing and an operator's view are read.
func TestKeysViewSharesTheTenantsListBound(t *testing.T) {
	t.Parallel()
	b, ctx, entered := setupOneList(t)
	release := b.lockTable(ctx, t, "tasks")

	held := b.getInBackground(secretAOps, "/v1/queues/shared/keys")
	entered(tenantOn[0])
	for _, c := range []struct{ secret, path string }{
		{secretAOps, "/v1/queues/shared/keys"},
		{secretA, "/v1/runs"},
	} {
		status, body := b.call(t, http.MethodGet, c.path, c.secret, nil)
		require.Equal(t, http.StatusTooManyRequests, status, "%s: %s", c.path, body)
		e := apiErr(t, body)
		require.Equal(t, api.CodeOverLimit, e.Code)
		require.Contains(t, e.Message, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT")
	}
	// The other tenant's listing is admitted, and an operator's view is
	// not counted at all; both wait on the lock like the first.
	heldB := b.getInBackground(secretB, "/v1/runs")
	entered(tenantOn[1])
	heldOps := b.getInBackground(secretWRead, "/v1/queues/shared/keys")

	release()
	for _, h := range []<-chan waitAnswer{held, heldB, heldOps} {
		a := <-h
		require.Equal(t, http.StatusOK, a.status, string(a.body))
	}
	status, body := b.call(t, http.MethodGet, "/v1/queues/shared/keys", secretAOps, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	b.requireNoListsLeft(t)
}
