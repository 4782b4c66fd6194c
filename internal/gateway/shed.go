package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsignal"
	"github.com/harvest-run/harvest/pkg/api"
)

// Shedding: a gateway offered more starts than its shards can commit
// answers the excess at once instead of queueing it until every caller
// times out. Each shard has its own budget of starts in flight (those
// handed to its committer and not answered yet), so that a slow shard
// fills only its own budget and the tenants of the other shards are
// served as before. HTTP and NATS starts share the budget: they end in
// the same committer.
//
// A start that finds its shard's budget full waits for a slot for at most
// HARVEST_GATEWAY_START_QUEUE_WAIT and is then answered 503 unavailable
// with Retry-After: the gateway as a whole cannot take it now, whoever
// sends it. A tenant that already holds its share of the budget
// (HARVEST_GATEWAY_TENANT_START_SHARE, waiting starts included) is
// answered 429 over_limit with Retry-After at once: that excess is the
// tenant's own, the other tenants are still served, and sending it to
// another gateway would change nothing. When a slot frees, it goes to the
// waiting tenant with the fewest starts in flight, so a flooding tenant
// cannot take the slots a light tenant waits for.
//
// The budget is not fixed: a queue of starts that the committer cannot
// take as fast as they come makes each start wait longer. The gateway
// measures how long its admitted starts take, and while they take longer
// than their unloaded time plus HARVEST_GATEWAY_START_QUEUE_TARGET, it
// lowers the budget to what the shard commits in that time (Little's
// law: starts per second x the time allowed). When they are quick again
// it raises the budget back towards HARVEST_GATEWAY_STARTS_INFLIGHT. So
// an admitted start is answered in about that time, and the rest are
// refused in about HARVEST_GATEWAY_START_QUEUE_WAIT.

// Reasons a start is shed: the reason attribute of
// harvest.gateway.starts.shed.
const (
	// shedTenantShare: the tenant holds its share of the shard's budget
	// (429).
	shedTenantShare = "tenant_share"
	// shedShardFull: no slot came free within the queue wait (503).
	shedShardFull = "shard_full"
	// shedNATSBusy: every NATS start handler was busy
	// (HARVEST_GATEWAY_NATS_INFLIGHT; 503).
	shedNATSBusy = "nats_busy"
)

// Tuning of the budget's controller.
const (
	// shedWindow is the least time over which the controller averages
	// the starts' times before it moves the budget.
	shedWindow = 100 * time.Millisecond
	// shedMinSamples is the least number of answered starts a window
	// needs: a mean of one or two says nothing.
	shedMinSamples = 4
	// shedGrowth is the factor the budget grows by per quick window.
	shedGrowth = 1.1
	// shedBaseDrift is the fraction of the distance to a quick window's
	// mean by which the unloaded time moves up, so that a shard that got
	// slower for good is not taken for a queue for ever.
	shedBaseDrift = 1.0 / 16
)

// shedder is one shard's budget of starts in flight on this gateway.
type shedder struct {
	max    int           // HARVEST_GATEWAY_STARTS_INFLIGHT
	floor  int           // the controller's lowest budget
	share  float64       // HARVEST_GATEWAY_TENANT_START_SHARE / 100
	wait   time.Duration // HARVEST_GATEWAY_START_QUEUE_WAIT
	target time.Duration // HARVEST_GATEWAY_START_QUEUE_TARGET
	now    func() time.Time

	mu       sync.Mutex
	limit    float64 // the budget now, from floor to max
	inflight int     // weight of the admitted starts not answered yet
	tenants  map[string]*tenantStarts
	// queued holds the tenants with waiting starts.
	queued map[string]*tenantStarts
	seq    uint64

	// The controller's window and the unloaded time of a start.
	winStart time.Time
	winN     int
	winSum   time.Duration
	base     time.Duration

	// onChange reports the starts in flight and the budget after a
	// change (metrics); nil in unit tests.
	onChange func(inflight, limit int)

	// steps tells a test what the shedder did; it does nothing unless a
	// test initialised it.
	steps testsignal.Signal[shedStep]
}

// shedStep is what a shedder signals to a test.
type shedStep struct {
	Tenant string
	// Step is "admitted", "queued", "granted" (a waiting start got its
	// slot) or a shed reason.
	Step     string
	Inflight int
}

// tenantStarts are one tenant's starts on a shedder.
type tenantStarts struct {
	name     string
	inflight int
	waiting  int // weight of the waiting starts
	waiters  []*shedWaiter
}

// shedWaiter is a start waiting for a slot.
type shedWaiter struct {
	weight  int
	seq     uint64
	ready   chan struct{}
	granted bool
}

// shedSlot is an admitted start's hold on the budget; release it once
// the start is answered.
type shedSlot struct {
	s      *shedder
	tenant string
	weight int
	at     time.Time
}

func newShedder(cfg Config, now func() time.Time) *shedder {
	if now == nil {
		now = time.Now
	}
	most := cfg.StartsInflight
	return &shedder{
		max:     most,
		floor:   min(most, 2*cfg.GroupMax),
		share:   float64(cfg.TenantStartShare) / 100,
		wait:    cfg.StartQueueWait,
		target:  cfg.StartQueueTarget,
		now:     now,
		limit:   float64(most),
		tenants: map[string]*tenantStarts{},
		queued:  map[string]*tenantStarts{},
	}
}

// budgetLocked is the budget now, in whole starts.
func (s *shedder) budgetLocked() int { return max(1, int(math.Ceil(s.limit))) }

// tenantCapLocked is the most one tenant may hold, waiting included.
// Without a share (100%) a tenant may hold the whole budget and wait for
// more like anyone else.
func (s *shedder) tenantCapLocked() int {
	if s.share >= 1 {
		return math.MaxInt / 2
	}
	return max(1, int(float64(s.budgetLocked())*s.share))
}

// acquire admits a start of weight starts (a batch's items) for tenant,
// waiting up to the queue wait for a slot. It returns the slot, or nil and
// the reason the start is shed. A weight above the tenant's share counts
// as the share, so that a large batch still goes when the tenant has
// nothing else in flight.
func (s *shedder) acquire(ctx context.Context, tenant string, weight int) (*shedSlot, string) {
	s.mu.Lock()
	w := min(max(weight, 1), s.tenantCapLocked(), s.budgetLocked())
	ts := s.tenants[tenant]
	if ts == nil {
		ts = &tenantStarts{name: tenant}
		s.tenants[tenant] = ts
	}
	if ts.inflight+ts.waiting+w > s.tenantCapLocked() {
		s.forgetLocked(tenant, ts)
		n := s.inflight
		s.mu.Unlock()
		s.steps.Signal(shedStep{Tenant: tenant, Step: shedTenantShare, Inflight: n})
		return nil, shedTenantShare
	}
	if len(s.queued) == 0 && s.inflight+w <= s.budgetLocked() {
		slot := s.admitLocked(tenant, ts, w)
		n := s.inflight
		s.mu.Unlock()
		s.steps.Signal(shedStep{Tenant: tenant, Step: "admitted", Inflight: n})
		return slot, ""
	}
	if s.wait <= 0 {
		s.forgetLocked(tenant, ts)
		n := s.inflight
		s.mu.Unlock()
		s.steps.Signal(shedStep{Tenant: tenant, Step: shedShardFull, Inflight: n})
		return nil, shedShardFull
	}
	s.seq++
	wt := &shedWaiter{weight: w, seq: s.seq, ready: make(chan struct{})}
	ts.waiters = append(ts.waiters, wt)
	ts.waiting += w
	s.queued[tenant] = ts
	// The budget may have room that only the order kept from this start.
	s.grantLocked()
	n := s.inflight
	s.mu.Unlock()
	s.steps.Signal(shedStep{Tenant: tenant, Step: "queued", Inflight: n})

	t := time.NewTimer(s.wait)
	defer t.Stop()
	select {
	case <-wt.ready:
		return &shedSlot{s: s, tenant: tenant, weight: w, at: s.now()}, ""
	case <-t.C:
	case <-ctx.Done():
	}
	s.mu.Lock()
	if wt.granted {
		// Granted as the wait ended: the slot is taken, use it.
		s.mu.Unlock()
		return &shedSlot{s: s, tenant: tenant, weight: w, at: s.now()}, ""
	}
	for i, x := range ts.waiters {
		if x == wt {
			ts.waiters = append(ts.waiters[:i], ts.waiters[i+1:]...)
			break
		}
	}
	ts.waiting -= w
	if len(ts.waiters) == 0 {
		delete(s.queued, tenant)
	}
	s.forgetLocked(tenant, ts)
	n = s.inflight
	s.mu.Unlock()
	s.steps.Signal(shedStep{Tenant: tenant, Step: shedShardFull, Inflight: n})
	return nil, shedShardFull
}

// admitLocked takes w of the budget for tenant.
func (s *shedder) admitLocked(tenant string, ts *tenantStarts, w int) *shedSlot {
	s.inflight += w
	ts.inflight += w
	s.changedLocked()
	return &shedSlot{s: s, tenant: tenant, weight: w, at: s.now()}
}

// forgetLocked drops the entry of a tenant with nothing in flight or
// waiting, so that the map holds only the tenants starting now.
func (s *shedder) forgetLocked(tenant string, ts *tenantStarts) {
	if ts.inflight == 0 && ts.waiting == 0 {
		delete(s.tenants, tenant)
	}
}

// grantLocked gives free budget to waiting starts: each time to the
// waiting tenant with the fewest starts in flight (the earliest waiter
// among equals), its oldest waiting start first.
func (s *shedder) grantLocked() {
	for len(s.queued) > 0 {
		var best *tenantStarts
		for _, ts := range s.queued {
			if best == nil || ts.inflight < best.inflight ||
				(ts.inflight == best.inflight && ts.waiters[0].seq < best.waiters[0].seq) {
				best = ts
			}
		}
		wt := best.waiters[0]
		if s.inflight+wt.weight > s.budgetLocked() {
			return
		}
		best.waiters = best.waiters[1:]
		best.waiting -= wt.weight
		best.inflight += wt.weight
		s.inflight += wt.weight
		if len(best.waiters) == 0 {
			delete(s.queued, best.name)
		}
		wt.granted = true
		close(wt.ready)
		s.changedLocked()
		s.steps.Signal(shedStep{Tenant: best.name, Step: "granted", Inflight: s.inflight})
	}
}

// release gives the slot back once its start is answered, and feeds the
// time the start took to the controller.
func (sl *shedSlot) release() {
	s := sl.s
	took := s.now().Sub(sl.at)
	s.mu.Lock()
	s.inflight -= sl.weight
	if ts := s.tenants[sl.tenant]; ts != nil {
		ts.inflight -= sl.weight
		s.forgetLocked(sl.tenant, ts)
	}
	s.observeLocked(took)
	s.grantLocked()
	s.changedLocked()
	s.mu.Unlock()
}

// observeLocked is the controller: it moves the budget once a window has
// enough answered starts.
func (s *shedder) observeLocked(took time.Duration) {
	now := s.now()
	if s.winStart.IsZero() {
		s.winStart = now
	}
	s.winN++
	s.winSum += took
	elapsed := now.Sub(s.winStart)
	if elapsed < shedWindow || s.winN < shedMinSamples {
		return
	}
	mean := s.winSum / time.Duration(s.winN)
	rate := float64(s.winN) / elapsed.Seconds()
	s.winStart, s.winN, s.winSum = now, 0, 0
	if s.base == 0 || mean < s.base {
		s.base = mean
	}
	allowed := s.base + s.target
	if mean > allowed {
		// A queue: keep only what the shard commits in the allowed time.
		s.limit = max(float64(s.floor), min(s.limit, rate*allowed.Seconds()))
		return
	}
	s.base += time.Duration(float64(mean-s.base) * shedBaseDrift)
	if s.limit < float64(s.max) {
		s.limit = min(float64(s.max), s.limit*shedGrowth+1)
	}
}

// changedLocked reports the starts in flight and the budget.
func (s *shedder) changedLocked() {
	if s.onChange != nil {
		s.onChange(s.inflight, s.budgetLocked())
	}
}

// shedMetrics are the metrics of shedding.
type shedMetrics struct {
	shed     metric.Int64Counter
	inflight metric.Int64Gauge
	limit    metric.Int64Gauge
}

func newShedMetrics(m metric.Meter) (shedMetrics, error) {
	var sm shedMetrics
	var err error
	if sm.shed, err = m.Int64Counter("harvest.gateway.starts.shed",
		metric.WithDescription("Starts refused by the gateway's shedding, by transport and reason (tenant_share: 429, shard_full and nats_busy: 503)."),
		metric.WithUnit("{start}")); err != nil {
		return sm, fmt.Errorf("gateway: metrics: %w", err)
	}
	if sm.inflight, err = m.Int64Gauge("harvest.gateway.starts.inflight",
		metric.WithDescription("Starts the gateway has handed to a shard and not answered yet, by shard."),
		metric.WithUnit("{start}")); err != nil {
		return sm, fmt.Errorf("gateway: metrics: %w", err)
	}
	if sm.limit, err = m.Int64Gauge("harvest.gateway.starts.limit",
		metric.WithDescription("The gateway's budget of starts in flight to a shard now (at most HARVEST_GATEWAY_STARTS_INFLIGHT, lowered while starts queue)."),
		metric.WithUnit("{start}")); err != nil {
		return sm, fmt.Errorf("gateway: metrics: %w", err)
	}
	return sm, nil
}

// initShedding makes one shedder per shard.
func (g *Gateway) initShedding() error {
	sm, err := newShedMetrics(g.meter)
	if err != nil {
		return err
	}
	g.shedMetrics = sm
	if g.cfg.TenantStartShare >= 100 {
		// A protection turned off is said once, at start.
		g.log.Warn("gateway: no per-tenant share of the starts in flight (HARVEST_GATEWAY_TENANT_START_SHARE=100): one tenant's flood can take a shard's whole budget")
	}
	for i := range g.cfg.Shards {
		s := newShedder(g.cfg, nil)
		at := metric.WithAttributeSet(attribute.NewSet(attribute.String("shard", strconv.Itoa(i))))
		s.onChange = func(inflight, limit int) {
			ctx := context.Background()
			sm.inflight.Record(ctx, int64(inflight), at)
			sm.limit.Record(ctx, int64(limit), at)
		}
		g.shedders = append(g.shedders, s)
	}
	return nil
}

// admitStarts takes a slot for weight starts of the caller on its tenant's
// home shard. It returns the release to call once the starts are
// answered, or the error to answer them with. A tenant whose home cannot
// be looked up is let through: the start itself answers that (503).
func (g *Gateway) admitStarts(ctx context.Context, c caller, weight int) (func(), *api.Error) {
	if weight <= 0 || len(g.shedders) == 0 {
		return func() {}, nil
	}
	e, err := g.dir.Home(ctx, c.tenant)
	if err != nil || e.Shard < 0 || e.Shard >= len(g.shedders) {
		return func() {}, nil
	}
	slot, reason := g.shedders[e.Shard].acquire(ctx, c.tenant, weight)
	if slot != nil {
		return slot.release, nil
	}
	var ae *api.Error
	if reason == shedTenantShare {
		ae = api.NewError(api.CodeOverLimit, "tenant %s has its share of the starts this gateway has in flight to its shard (HARVEST_GATEWAY_TENANT_START_SHARE); try again after the Retry-After", c.tenant)
	} else {
		ae = api.NewError(api.CodeUnavailable, "the gateway has as many starts in flight to shard %d as it can commit in time; try again after the Retry-After, or on another gateway", e.Shard)
	}
	ae.RetryAfterMS = g.cfg.ShedRetryAfter.Milliseconds()
	g.shedMetrics.shed.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("transport", c.transport), attribute.String("reason", reason))))
	g.countRefused(ctx, c.transport, ae)
	return nil, ae
}

// natsBusy answers a NATS start that found every handler busy: 503 with
// retry_after_ms, on the tenant's own inbox only, as natsStart would.
func (g *Gateway) natsBusy(msg *nats.Msg, batch bool) {
	kind := ".start."
	if batch {
		kind = ".start_batch."
	}
	tenant := strings.TrimPrefix(msg.Subject, g.cfg.SubjectPrefix+kind)
	e := api.NewError(api.CodeUnavailable, "the gateway is handling as many NATS starts as it may (HARVEST_GATEWAY_NATS_INFLIGHT); try again after retry_after_ms, when this or another gateway takes it")
	e.RetryAfterMS = g.cfg.ShedRetryAfter.Milliseconds()
	ctx := context.Background()
	g.shedMetrics.shed.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("transport", TransportNATS), attribute.String("reason", shedNATSBusy))))
	g.countRefused(ctx, TransportNATS, e)
	if msg.Reply == "" || auth.ValidateTenant(tenant) != nil || !natsauth.OwnInbox(tenant, msg.Reply) {
		return
	}
	b, err := json.Marshal(api.ErrorBody{Error: e})
	if err != nil {
		return
	}
	out := nats.NewMsg(msg.Reply)
	out.Header.Set(StatusHeader, strconv.Itoa(e.Status))
	out.Data = b
	if err := g.nc.PublishMsg(out); err != nil {
		g.log.Warn("gateway: NATS reply", "err", err)
	}
}

// withRetryAfter gives a 503 answer to a start a Retry-After when it has
// none (a shard that did not answer): the caller should come back, and
// not at once.
func (g *Gateway) withRetryAfter(e *api.Error) *api.Error {
	if e == nil || e.Code != api.CodeUnavailable || e.RetryAfterMS > 0 {
		return e
	}
	c := *e
	c.RetryAfterMS = g.cfg.ShedRetryAfter.Milliseconds()
	return &c
}

// Readiness under load: /readyz pings each shard through a pool of its
// own of one connection, and keeps the answer for readyFor, so that a
// shard pool full of starts does not make a loaded gateway look down
// (and a restarted one never come up), and a flood of probes costs the
// shards one ping per readyFor.

// readyFor is how long a shard's ping answers /readyz.
const readyFor = 500 * time.Millisecond

// readyPing bounds one ping of /readyz.
const readyPing = 2 * time.Second

// probePoolOf makes the one-connection pool of /readyz from a shard
// pool's configuration.
func probePoolOf(shard int, pc *pgxpool.Config) (*pgxpool.Pool, error) {
	c := pc.Copy()
	c.MaxConns, c.MinConns = 1, 0
	return pgpool.New(context.Background(), shard, pgpool.AppGateway, c)
}

// readiness keeps the last ping of each shard.
type readiness struct {
	mu   sync.Mutex
	at   []time.Time
	ok   []bool
	ping func(ctx context.Context, shard int) error
}

// check returns whether each of n shards answered a ping lately, pinging
// the ones whose answer is older than readyFor (at once, each under
// readyPing: the module's fan-out, internal/shards.Each).
func (r *readiness) check(ctx context.Context, n int) []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) != n {
		r.at, r.ok = make([]time.Time, n), make([]bool, n)
	}
	now := time.Now()
	var stale []int
	for i := range n {
		if r.at[i].IsZero() || now.Sub(r.at[i]) >= readyFor {
			stale = append(stale, i)
		}
	}
	for _, a := range shards.Each(ctx, stale, func(_, i int) int { return i }, readyPing,
		func(ctx context.Context, i, _ int) (struct{}, error) { return struct{}{}, r.ping(ctx, i) }) {
		r.ok[a.Shard], r.at[a.Shard] = a.Err == nil, time.Now()
	}
	return slices.Clone(r.ok)
}
