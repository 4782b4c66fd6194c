package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A tenant's run listings are bounded on each gateway: past
// HARVEST_GATEWAY_MAX_LISTS_PER_TENANT in flight the next one is answered
// 429 with Retry-After at once, while another tenant's is read as usual,
// and the slot is the tenant's again once its listing is answered. The
// listings are held on the shards by a lock on runs, as a long read of a
// big history would hold them.
func TestListsBoundedPerTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tune: func(c *Config) { c.MaxListsPerTenant = 1 }})
	b.gw.lists.entered.Init()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	entered := func(tenant string) {
		t.Helper()
		_, err := b.gw.lists.entered.WaitFor(ctx, func(got string) bool { return got == tenant })
		require.NoError(t, err, "a listing of %s admitted", tenant)
	}
	var locks []pgx.Tx
	for _, db := range b.dbs {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // released below
		_, err = tx.Exec(ctx, `LOCK TABLE runs IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		locks = append(locks, tx)
	}

	heldA := b.getInBackground(secretA, "/v1/runs?status=failed")
	entered(tenantOn[0])
	status, body := b.call(t, http.MethodGet, "/v1/runs", secretA, nil)
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	e := apiErr(t, body)
	require.Equal(t, api.CodeOverLimit, e.Code)
	require.Equal(t, int64(1000), e.RetryAfterMS)
	require.Contains(t, e.Message, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT")

	// The other tenant is admitted (and waits on the lock like the first).
	heldB := b.getInBackground(secretB, "/v1/runs")
	entered(tenantOn[1])

	for _, tx := range locks {
		require.NoError(t, tx.Rollback(ctx))
	}
	for _, held := range []<-chan waitAnswer{heldA, heldB} {
		a := <-held
		require.Equal(t, http.StatusOK, a.status, string(a.body))
	}
	status, body = b.call(t, http.MethodGet, "/v1/runs", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	b.gw.lists.mu.Lock()
	left := len(b.gw.lists.byTenant)
	b.gw.lists.mu.Unlock()
	require.Zero(t, left, "no listing left in flight")
}
