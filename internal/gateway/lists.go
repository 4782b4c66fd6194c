package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/testsignal"
	"github.com/harvest-run/harvest/pkg/api"
)

// listRetryAfter is what a listing refused at its tenant's bound asks the
// caller to wait: the tenant's listings in flight end within their
// statement's time.
const listRetryAfter = time.Second

// listBound bounds the listings a gateway reads at once for each tenant:
// its run listings (GET /v1/runs, its console session's runs page) and its
// per-key views (GET /v1/queues/{queue}/keys, which counts the queue's
// pending tasks). A listing with a filter few runs match (a final
// status, a queue, a name) reads up to runstore.DefaultListScan runs for
// one page, tens of milliseconds, on a connection of the shard's pool, the
// pool the gateway's starts commit through. Without a bound, one tenant's
// listings sent side by side could hold every connection, and every
// tenant's starts would wait for them. Past the
// bound a listing is answered 429 with Retry-After at once, as a long
// poll past its bound is.
type listBound struct {
	max int

	mu sync.Mutex
	// byTenant counts each tenant's listings in flight; a tenant with
	// none has no entry.
	byTenant map[string]int

	// refused counts the listings answered 429 (no tenant label: the
	// tenant goes on the request's span).
	refused metric.Int64Counter

	// entered tells a test the tenant of each listing admitted; it does
	// nothing unless a test initialised it.
	entered testsignal.Signal[string]
}

func newListBound(max int, meter metric.Meter) (*listBound, error) {
	b := &listBound{max: max, byTenant: make(map[string]int)}
	var err error
	if b.refused, err = meter.Int64Counter("harvest.gateway.lists.refused",
		metric.WithDescription("Listings of a tenant (GET /v1/runs, its console runs page, GET /v1/queues/{queue}/keys) answered 429 because the tenant already had as many in flight on the gateway as HARVEST_GATEWAY_MAX_LISTS_PER_TENANT allows."),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	return b, nil
}

// enter admits a listing of tenant, or returns the 429 to answer. An
// admitted listing calls leave when its read is done.
func (b *listBound) enter(ctx context.Context, tenant string) *api.Error {
	b.mu.Lock()
	if b.byTenant[tenant] >= b.max {
		b.mu.Unlock()
		b.refused.Add(ctx, 1)
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("harvest.tenant", tenant),
			attribute.Bool("harvest.list_refused", true))
		e := api.NewError(api.CodeOverLimit,
			"tenant %s already has %d listings (of runs or of a queue's keys) in flight on this gateway, its bound (HARVEST_GATEWAY_MAX_LISTS_PER_TENANT): list again after retry_after_ms",
			tenant, b.max)
		e.RetryAfterMS = listRetryAfter.Milliseconds()
		return e
	}
	b.byTenant[tenant]++
	b.mu.Unlock()
	b.entered.Signal(tenant)
	return nil
}

// leave ends a listing enter admitted.
func (b *listBound) leave(tenant string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byTenant[tenant]--; b.byTenant[tenant] <= 0 {
		delete(b.byTenant, tenant)
	}
}
