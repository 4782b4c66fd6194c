package runstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// shardCounts reads the shard's maintained count of unfinished runs, the
// sum of the tenants' counts and the unfinished runs, in one snapshot.
func (b bundle) shardCounts(t *testing.T) [3]int {
	t.Helper()
	var c [3]int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT harvest_shard_running(),
		(SELECT coalesce(sum(running), 0) FROM tenant_running),
		(SELECT count(*) FROM runs WHERE finished_at IS NULL)`).Scan(&c[0], &c[1], &c[2]))
	return c
}

// The shard's count of unfinished runs (shard_running, which the start
// statement reads instead of summing every tenant's count) follows every
// change of the tenants' counts: start groups decided by rule and by a
// hook, completion batches, rescues of expired leases, cancels and
// retries, all at once. Afterwards it equals the sum of the counts and the
// unfinished runs. Broken by hand, it is reported by Drift and healed by
// the recount, which then finds nothing more.
func TestShardCountFollowsTenantCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli", "a-c", "a_b"}
	ruledC := NewCommitter(b.db, 1, CommitterOptions{Flushers: 2, MaxBatch: 8, Admitter: &ruled{rule: noLimit()}})
	askedC := NewCommitter(b.db, 1, CommitterOptions{Flushers: 2, MaxBatch: 8, Admitter: &recorder{}})
	defer ruledC.Close()
	defer askedC.Close()

	const rounds = 15
	var wg sync.WaitGroup
	errc := make(chan error, 256)
	report := func(what string, err error) {
		if err != nil {
			errc <- fmt.Errorf("%s: %w", what, err)
		}
	}
	for k, c := range []*Committer{ruledC, askedC} {
		wg.Go(func() {
			for r := range rounds {
				var ps []StartParams
				for i, tenant := range tenants {
					// Every other run waits in a queue nobody claims.
					queue := []string{"total-q", "total-idle"}[(r+i)%2]
					ps = append(ps, StartParams{Tenant: tenant, Shard: 1, Req: api.StartRequest{
						ID: fmt.Sprintf("c%d-r%d-%d", k, r, i), Name: "echo", Queue: queue, Input: json.RawMessage(`{}`)}})
				}
				for _, res := range c.StartMany(b.ctx, ps) {
					report("start", res.Err)
				}
			}
		})
	}
	// Completion batches of whatever is pending; every third task's lease
	// is left to expire and rescued instead.
	wg.Go(func() {
		for r := range rounds * 2 {
			got, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "total-q"}, 8)
			if err != nil {
				report("claim", err)
				return
			}
			var cs []claim.Completion
			for i, g := range got {
				if !g.OK {
					continue
				}
				if (r+i)%3 == 0 {
					_, err := b.db.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 minute',
						attempt = 3 WHERE id = $1`, g.Task.ID)
					report("expire", err)
					continue
				}
				cs = append(cs, claim.Completion{ID: g.Task.ID, Token: g.Task.LeaseToken, Output: json.RawMessage(`{}`)})
			}
			if len(cs) > 0 {
				errs, err := claim.CompleteBatch(b.ctx, b.db, cs)
				report("complete", errors.Join(append(errs, err)...))
			}
			_, err = claim.RescueExpired(b.ctx, b.db, 100)
			report("rescue", err)
		}
	})
	// Cancels and retries by hand, of runs in the queue nobody claims.
	wg.Go(func() {
		for r := range rounds {
			i := 1 - r%2 // (r + i) odd: a run of "total-idle"
			tenant := tenants[i]
			id := fmt.Sprintf("c0-r%d-%d", r, i)
			for {
				_, err := Get(b.ctx, b.db, tenant, id, 1)
				if err == nil {
					break
				}
				if !errors.Is(err, ErrNotFound) {
					report("get", err)
					return
				}
				time.Sleep(time.Millisecond) // the start goroutine has not written it yet
			}
			_, err := Cancel(b.ctx, b.db, tenant, id, 1, "test")
			report("cancel", err)
			_, err = Retry(b.ctx, b.db, RetryParams{Tenant: tenant, ID: id, Shard: 1, Actor: "tester", Admitter: &recorder{}})
			if !errors.Is(err, ErrNotRetryable) {
				report("retry", err)
			}
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	counts := b.shardCounts(t)
	require.Positive(t, counts[2])
	require.Equal(t, [3]int{counts[2], counts[2], counts[2]}, counts,
		"the shard's count, the sum of the tenants' counts and the unfinished runs")
	drift, err := tenantcap.Drift(b.ctx, b.db)
	require.NoError(t, err)
	require.Empty(t, drift)

	// Broken by hand: one stripe's falls raised, another stripe's row gone.
	_, err = b.db.Exec(b.ctx, `UPDATE shard_running SET removed = removed + 5 WHERE stripe = 3;
		DELETE FROM shard_running WHERE stripe = 7`)
	require.NoError(t, err)
	drift, err = tenantcap.Drift(b.ctx, b.db)
	require.NoError(t, err)
	require.Len(t, drift, 1)
	require.True(t, drift[0].Total)
	require.True(t, drift[0].Created, "a row of the shard's count is missing")
	require.Equal(t, counts[2], drift[0].Now)
	require.NotEqual(t, counts[2], drift[0].Was)

	fixes, err := tenantcap.Recount(b.ctx, b.db)
	require.NoError(t, err)
	require.Len(t, fixes, 1)
	require.Equal(t, tenantcap.Fix{Total: true, Created: true, Was: drift[0].Was, Now: counts[2]}, fixes[0])
	require.Equal(t, [3]int{counts[2], counts[2], counts[2]}, b.shardCounts(t))
	require.Equal(t, 17, b.count(t, `SELECT count(*) FROM shard_running`))
	fixes, err = tenantcap.Recount(b.ctx, b.db)
	require.NoError(t, err)
	require.Empty(t, fixes, "a second recount finds nothing")
}
