package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// shedConfig is a configuration for the shedder's own tests.
func shedConfig(most, share int, wait time.Duration) Config {
	cfg := DefaultConfig([]string{"x"}, "")
	cfg.StartsInflight, cfg.TenantStartShare, cfg.StartQueueWait = most, share, wait
	cfg.GroupMax = 2
	return cfg
}

// waitStep waits for the shedder to signal a step of tenant.
func waitShed(t *testing.T, s *shedder, tenant, step string) shedStep {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := s.steps.WaitFor(ctx, func(v shedStep) bool { return v.Tenant == tenant && v.Step == step })
	require.NoError(t, err, "%s %s", tenant, step)
	return v
}

// A slot that comes free goes to the waiting tenant with the fewest starts
// in flight, not to the tenant that has waited longest: a flooding tenant
// that queued first does not take the slot a light tenant waits for.
func TestShedderGivesFreedSlotToTheTenantWithFewestInFlight(t *testing.T) {
	t.Parallel()
	// The waits never run out: only a grant ends them.
	s := newShedder(shedConfig(2, 100, time.Hour), nil)
	s.steps.Init()
	ctx := context.Background()
	a1, _ := s.acquire(ctx, "flood", 1)
	a2, _ := s.acquire(ctx, "flood", 1)
	require.NotNil(t, a1)
	require.NotNil(t, a2)

	got := map[string]chan *shedSlot{"flood": make(chan *shedSlot, 1), "light": make(chan *shedSlot, 1)}
	go func() { sl, _ := s.acquire(ctx, "flood", 1); got["flood"] <- sl }()
	waitShed(t, s, "flood", "queued")
	go func() { sl, _ := s.acquire(ctx, "light", 1); got["light"] <- sl }()
	waitShed(t, s, "light", "queued")

	a1.release()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := s.steps.WaitFor(wctx, func(v shedStep) bool { return v.Step == "granted" })
	require.NoError(t, err)
	require.Equal(t, "light", v.Tenant, "the light tenant, with nothing in flight, gets the freed slot")
	require.NotNil(t, <-got["light"])
	a2.release()
	require.NotNil(t, <-got["flood"], "the next freed slot goes to the flood's waiting start")
}

// A tenant holding its share of the budget is refused at once (429 reason),
// even with a long queue wait, while another tenant is still admitted.
func TestShedderRefusesATenantPastItsShare(t *testing.T) {
	t.Parallel()
	s := newShedder(shedConfig(4, 50, time.Hour), nil)
	ctx := context.Background()
	for range 2 {
		sl, reason := s.acquire(ctx, "flood", 1)
		require.NotNil(t, sl, reason)
	}
	sl, reason := s.acquire(ctx, "flood", 1)
	require.Nil(t, sl)
	require.Equal(t, shedTenantShare, reason)
	sl, reason = s.acquire(ctx, "light", 1)
	require.NotNil(t, sl, reason)

	// A batch larger than the share counts as the share: it goes when the
	// tenant has nothing else in flight, and a second one does not.
	s = newShedder(shedConfig(4, 50, 0), nil)
	big, reason := s.acquire(ctx, "batch", 100)
	require.NotNil(t, big, reason)
	_, reason = s.acquire(ctx, "batch", 100)
	require.Equal(t, shedTenantShare, reason)
}

// While admitted starts take much longer than they did unloaded, the
// budget drops to what the shard answers in the allowed time, so further
// starts are refused instead of queued; once starts are quick again the
// budget grows back to its maximum.
func TestShedderLowersItsBudgetWhileStartsQueue(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	cfg := shedConfig(100, 100, 0)
	cfg.StartQueueTarget = 100 * time.Millisecond
	s := newShedder(cfg, clock)
	ctx := context.Background()
	// round admits n starts, lets each take took, and answers them spread
	// over a window.
	round := func(n int, took time.Duration) {
		var slots []*shedSlot
		for range n {
			sl, reason := s.acquire(ctx, "t", 1)
			require.NotNil(t, sl, reason)
			slots = append(slots, sl)
		}
		now = now.Add(took)
		for _, sl := range slots {
			now = now.Add(shedWindow / time.Duration(n))
			sl.release()
		}
	}
	budget := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.budgetLocked()
	}
	round(10, 10*time.Millisecond) // unloaded: 10ms and the window
	round(10, 10*time.Millisecond)
	require.Equal(t, 100, budget())
	round(40, 2*time.Second) // a queue: 2s each, 400 answered per second
	require.Less(t, budget(), 100)
	require.GreaterOrEqual(t, budget(), s.floor)
	low := budget()
	// The budget full, the next start is refused (no queue wait here).
	var held []*shedSlot
	for range low {
		sl, _ := s.acquire(ctx, "t", 1)
		require.NotNil(t, sl)
		held = append(held, sl)
	}
	sl, reason := s.acquire(ctx, "t", 1)
	require.Nil(t, sl)
	require.Equal(t, shedShardFull, reason)
	for _, sl := range held {
		sl.release()
	}
	for range 40 {
		round(s.floor, 10*time.Millisecond)
	}
	require.Equal(t, 100, budget(), "quick starts bring the budget back")
}

// httpStartRaw sends one start over HTTP and returns the answer's status,
// Retry-After header and body.
func httpStartRaw(ctx context.Context, b *bundle, secret, body string) (int, string, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/v1/runs", strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out, err
}

// blockRuns holds a lock on the shard's runs table that every start's
// insert waits for, until the returned function ends it: the committer
// is stuck, as under a flood it cannot keep up with.
func blockRuns(t *testing.T, b *bundle, shard int) func() {
	t.Helper()
	tx, err := b.dbs[shard].Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `LOCK TABLE runs IN SHARE MODE`)
	require.NoError(t, err)
	var once sync.Once
	end := func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(end)
	return end
}

// A gateway offered more starts than its shard takes answers the excess
// with 503 and Retry-After (HTTP header, retry_after_ms over NATS) while
// its committer is stuck, so the refusals do not wait on the committer;
// /readyz still answers 200 although the shard's only pooled connection
// is held by the stuck group; and every start it acknowledged is in the
// database once the committer moves again.
func TestShedRefusesTheExcessWhileTheCommitterIsStuck(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 1000, Tune: func(c *Config) {
		c.StartsInflight, c.TenantStartShare, c.StartQueueWait = 4, 100, 10*time.Millisecond
		// The pool is as small as the committer's flushers, so the stuck
		// group holds all of it, as starts hold a loaded gateway's pool.
		c.PoolSize, c.GroupFlushers = 1, 1
	}})
	tenant := tenantOn[0]
	home := b.gw.home(tenant)
	s := b.gw.shedders[home]
	s.steps.Init()
	// The directory knows the tenant before the shard is blocked.
	status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"warm"`))
	require.Equal(t, 201, status, string(out))

	unblock := blockRuns(t, b, home)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	type answer struct {
		id     string
		status int
		err    error
	}
	answers := make(chan answer, 4)
	for i := range 4 {
		id := "held-" + string(rune('a'+i))
		go func() {
			st, _, _, err := httpStartRaw(ctx, b, secretA, startBody(`"id":"`+id+`"`))
			answers <- answer{id, st, err}
		}()
	}
	for {
		if v := waitShed(t, s, tenant, "admitted"); v.Inflight == 4 {
			break
		}
	}

	// The fifth start finds the budget full and is refused, over HTTP...
	st, retryAfter, body, err := httpStartRaw(ctx, b, secretA, startBody(`"id":"refused-http"`))
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, st, string(body))
	require.Equal(t, "1", retryAfter)
	e := apiErr(t, body)
	require.Equal(t, api.CodeUnavailable, e.Code)
	require.Equal(t, int64(1000), e.RetryAfterMS)
	// ... and over NATS.
	_, err = b.natsClient(t, tenant).StartRequest(ctx, api.StartRequest{ID: "refused-nats", Name: "echo", Queue: "shared"})
	require.ErrorIs(t, err, client.ErrUnavailable)
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, time.Second, ce.RetryAfter())
	select {
	case a := <-answers:
		t.Fatalf("start %s was answered (%d, %v) while the committer was stuck", a.id, a.status, a.err)
	default:
	}

	// Readiness does not wait behind the stuck starts.
	status, out = b.call(t, "GET", "/readyz", "", nil)
	require.Equal(t, 200, status, string(out))
	status, _ = b.call(t, "GET", "/healthz", "", nil)
	require.Equal(t, 200, status)

	unblock()
	for range 4 {
		a := <-answers
		require.NoError(t, a.err)
		require.Equal(t, 201, a.status, a.id)
	}
	for _, id := range []string{"warm", "held-a", "held-b", "held-c", "held-d"} {
		require.Equal(t, 1, b.count(t, home, `SELECT count(*) FROM runs WHERE tenant = $1 AND id = $2`, tenant, id), id)
	}
	require.Zero(t, b.count(t, home, `SELECT count(*) FROM runs WHERE id LIKE 'refused-%'`))
}

// One tenant's flood takes at most its share of the shard's budget: past
// it the flood is answered 429 with Retry-After, and another tenant of the
// same shard still gets a slot while the flood's starts are stuck.
func TestShedKeepsATenantsFloodToItsShare(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 1000, Shards: []string{testsvc.NewDBURL(t)}, Tune: func(c *Config) {
		c.StartsInflight, c.TenantStartShare, c.StartQueueWait = 4, 50, 10*time.Millisecond
	}})
	s := b.gw.shedders[0]
	flood, light := b.natsClient(t, "flood"), b.natsClient(t, "light")
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	for _, c := range []*client.Client{flood, light} {
		_, err := c.Start(ctx, "echo", "shared", nil, client.StartOptions{})
		require.NoError(t, err)
	}

	unblock := blockRuns(t, b, 0)
	type answer struct {
		err error
	}
	held := make(chan answer, 8)
	refused := make(chan error, 4)
	var wg sync.WaitGroup
	s.steps.Init()
	for range 4 {
		wg.Go(func() {
			_, err := flood.Start(ctx, "echo", "shared", nil, client.StartOptions{})
			if errors.Is(err, client.ErrOverLimit) {
				refused <- err
				return
			}
			held <- answer{err}
		})
	}
	// Two of the flood's starts hold its share; the other two are refused
	// at once, without waiting for the stuck committer.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	admitted, shed := 0, 0
	_, err := s.steps.WaitFor(wctx, func(v shedStep) bool {
		switch {
		case v.Tenant == "flood" && v.Step == "admitted":
			admitted++
		case v.Tenant == "flood" && v.Step == shedTenantShare:
			shed++
		}
		return admitted == 2 && shed == 2
	})
	require.NoError(t, err, "admitted %d, shed %d", admitted, shed)
	for range 2 {
		var ce *client.Error
		require.ErrorAs(t, <-refused, &ce)
		require.Equal(t, time.Second, ce.RetryAfter())
	}

	// The light tenant is admitted beside the flood.
	go func() {
		_, err := light.Start(ctx, "echo", "shared", nil, client.StartOptions{ID: "light-1"})
		held <- answer{err}
	}()
	v := waitShed(t, s, "light", "admitted")
	require.Equal(t, 3, v.Inflight)

	unblock()
	for range 3 {
		require.NoError(t, (<-held).err)
	}
	wg.Wait()
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs WHERE tenant = 'light' AND id = 'light-1'`))
	require.Equal(t, 3, b.count(t, 0, `SELECT count(*) FROM runs WHERE tenant = 'flood'`), "the warm-up start and the two held ones")
}

// A NATS start that finds every start handler busy (here the one handler
// HARVEST_GATEWAY_NATS_INFLIGHT allows, held by a start stuck on its
// shard) is answered 503 with retry_after_ms at once, rather than left
// in the subscription's buffer until the stuck start ends.
func TestShedNATSStartWhenEveryHandlerIsBusy(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 1000, Shards: []string{testsvc.NewDBURL(t)}, Tune: func(c *Config) {
		c.NATSInflight = 1
	}})
	s := b.gw.shedders[0]
	c := b.natsClient(t, "acme")
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	_, err := c.Start(ctx, "echo", "shared", nil, client.StartOptions{})
	require.NoError(t, err)
	s.steps.Init()

	unblock := blockRuns(t, b, 0)
	held := make(chan error, 1)
	go func() {
		_, err := c.Start(ctx, "echo", "shared", nil, client.StartOptions{ID: "held"})
		held <- err
	}()
	waitShed(t, s, "acme", "admitted")

	_, err = c.Start(ctx, "echo", "shared", nil, client.StartOptions{ID: "busy"})
	require.ErrorIs(t, err, client.ErrUnavailable)
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, time.Second, ce.RetryAfter())
	require.Contains(t, ce.API.Message, "HARVEST_GATEWAY_NATS_INFLIGHT")
	select {
	case err := <-held:
		t.Fatalf("the held start was answered (%v) while the committer was stuck", err)
	default:
	}
	unblock()
	require.NoError(t, <-held)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM runs WHERE id = 'busy'`))
}

// The shedding settings are checked at start, each error naming its
// variable.
func TestShedSettingsAreValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tune func(*Config)
		want string
	}{
		{func(c *Config) { c.StartsInflight = 0 }, "HARVEST_GATEWAY_STARTS_INFLIGHT:"},
		{func(c *Config) { c.TenantStartShare = 0 }, "HARVEST_GATEWAY_TENANT_START_SHARE:"},
		{func(c *Config) { c.TenantStartShare = 101 }, "HARVEST_GATEWAY_TENANT_START_SHARE:"},
		{func(c *Config) { c.StartQueueWait = -time.Millisecond }, "HARVEST_GATEWAY_START_QUEUE_WAIT:"},
		{func(c *Config) { c.StartQueueWait = 2 * time.Second }, "HARVEST_GATEWAY_START_QUEUE_WAIT:"},
		{func(c *Config) { c.StartQueueTarget = time.Millisecond }, "HARVEST_GATEWAY_START_QUEUE_TARGET:"},
		{func(c *Config) { c.ShedRetryAfter = 0 }, "HARVEST_GATEWAY_SHED_RETRY_AFTER:"},
	} {
		cfg := DefaultConfig([]string{"postgres://127.0.0.1/x"}, "nats://127.0.0.1:4222")
		require.NoError(t, cfg.Validate())
		c.tune(&cfg)
		require.ErrorContains(t, cfg.Validate(), c.want)
	}
}
