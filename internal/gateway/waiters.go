package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/testsignal"
	"github.com/harvest-run/harvest/pkg/api"
)

// waitRetryAfter is what a long poll refused at a bound asks the caller
// to wait: waiters leave as their runs end or their waits run out, so a
// slot is usually free again within a second or so.
const waitRetryAfter = time.Second

// Bounds a long poll may find full, the value of the refused counter's
// "bound" attribute.
const (
	boundTenant  = "tenant"
	boundGateway = "gateway"
)

// waitHub holds the gateway's long polls (GET /v1/runs/{id}?wait=). It
// bounds them, per tenant and in all, and wakes them on their run's event
// through one NATS subscription of the gateway's own (<prefix>.runs.*.>),
// rather than one subscription per waiter: a waiter costs a map entry, not
// a subscription on the server and a round of interest changes in the
// cluster. nats.go subscribes it again after a reconnect by itself.
//
// The event is a hint only: Postgres holds the run. A waiter woken by one
// reads its run again from the shard; a lost event costs latency, since
// each waiter also rereads every HARVEST_GATEWAY_WAIT_FALLBACK (or every
// HARVEST_GATEWAY_WAIT_POLL while NATS is down or absent) and once more
// when its wait ends.
type waitHub struct {
	perTenant, total int
	fallback, poll   time.Duration

	nc  *nats.Conn
	sub *nats.Subscription

	mu sync.Mutex
	// byTenant counts each tenant's waiters; a tenant with none has no
	// entry, so the map holds only tenants waiting now.
	byTenant map[string]int
	count    int
	// bySubject holds the waiters listening on each run event subject.
	bySubject map[string]map[*waiter]struct{}
	closed    bool
	// released is closed when the gateway closes: every waiter answers at
	// once with the run as it last read it.
	released chan struct{}

	active  metric.Int64UpDownCounter
	refused metric.Int64Counter
	// refusedAt holds the refused counter's attributes of each bound.
	refusedAt map[string]metric.AddOption

	// steps tells a test what a long poll did (waitStep); it does nothing
	// unless a test initialised it before the first wait.
	steps testsignal.Signal[waitStep]
}

// waitStep is what a long poll signals to a test: for the id asked for,
// that it is about to sleep (waitAsleep) or how it ended.
type waitStep struct {
	ID   string
	Step string
}

// Steps of a long poll (waitStep.Step).
const (
	// waitAsleep: the waiter read a run that is not final and waits.
	waitAsleep = "asleep"
	// The wait ended: its first read found the run final (or failed),
	// or a read after a run event did, or a fallback reread did, or its
	// time ran out, or the gateway closed.
	waitEndFirstRead = "first read"
	waitEndEvent     = "event"
	waitEndReread    = "reread"
	waitEndDeadline  = "deadline"
	waitEndClosed    = "closed"
)

// waiter is one long poll in progress.
type waiter struct {
	tenant string
	// subjects are the event subjects it listens on: the id asked for
	// and, for a debounce or batch start, the id of the run it fired.
	subjects []string
	// wake gets a value when an event arrives on one of subjects; one is
	// enough, since the waiter reads the run afresh.
	wake chan struct{}
}

// newWaitHub makes the hub of the gateway's long polls, with its metrics.
func newWaitHub(cfg Config, meter metric.Meter) (*waitHub, error) {
	h := &waitHub{
		perTenant: cfg.MaxWaitersPerTenant,
		total:     cfg.MaxWaiters,
		fallback:  cfg.WaitFallback,
		poll:      cfg.WaitPoll,
		byTenant:  make(map[string]int),
		bySubject: make(map[string]map[*waiter]struct{}),
		released:  make(chan struct{}),
		refusedAt: map[string]metric.AddOption{
			boundTenant:  metric.WithAttributeSet(attribute.NewSet(attribute.String("bound", boundTenant))),
			boundGateway: metric.WithAttributeSet(attribute.NewSet(attribute.String("bound", boundGateway))),
		},
	}
	var err error
	if h.active, err = meter.Int64UpDownCounter("harvest.gateway.waits.active",
		metric.WithDescription("Long polls (GET /v1/runs/{id}?wait=) the gateway holds now."),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	if h.refused, err = meter.Int64Counter("harvest.gateway.waits.refused",
		metric.WithDescription("Long polls answered 429 because the gateway already held as many as a bound allows, by bound (tenant or gateway)."),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	return h, nil
}

// listenNATS subscribes the hub to the run events of every tenant. Without
// it (no connection, or the subscription failed) waiters poll.
func (h *waitHub) listenNATS(nc *nats.Conn, subjects string) error {
	sub, err := nc.Subscribe(subjects, h.deliver)
	if err != nil {
		return fmt.Errorf("gateway: subscribe %s: %w", subjects, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nc, h.sub = nc, sub
	return nil
}

// deliver wakes the waiters of the run an event names. It only looks the
// subject up: the waiter reads the run from its shard, so the body is
// never trusted, and an event nobody waits for costs a map lookup.
func (h *waitHub) deliver(m *nats.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.bySubject[m.Subject] {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// enter admits a long poll of tenant. Past a bound it returns the 429 to
// answer and which bound it was; after close it returns neither (the
// caller reads the run once instead of waiting).
func (h *waitHub) enter(ctx context.Context, tenant string) (*waiter, *api.Error, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ""
	}
	if h.byTenant[tenant] >= h.perTenant {
		e := api.NewError(api.CodeOverLimit,
			"tenant %s already has %d long polls waiting on this gateway, its bound (HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT); the run is not final yet: wait again after retry_after_ms",
			tenant, h.perTenant)
		e.RetryAfterMS = waitRetryAfter.Milliseconds()
		return nil, e, boundTenant
	}
	if h.count >= h.total {
		e := api.NewError(api.CodeOverLimit,
			"this gateway already holds %d long polls, its bound (HARVEST_GATEWAY_MAX_WAITERS); the run is not final yet: wait again after retry_after_ms",
			h.total)
		e.RetryAfterMS = waitRetryAfter.Milliseconds()
		return nil, e, boundGateway
	}
	h.byTenant[tenant]++
	h.count++
	h.active.Add(ctx, 1)
	return &waiter{tenant: tenant, wake: make(chan struct{}, 1)}, nil, ""
}

// refuse counts a long poll of tenant answered 429 at bound. The tenant
// goes on the request's span, never on the metric.
func (h *waitHub) refuse(ctx context.Context, tenant, bound string) {
	h.refused.Add(ctx, 1, h.refusedAt[bound])
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("harvest.tenant", tenant), attribute.String("harvest.wait_refused", bound))
}

// listen makes events on subject wake w, and reports whether it did not
// already. Waiters listen before they read, so an event sent between
// their read and their sleep still wakes them.
func (h *waitHub) listen(w *waiter, subject string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range w.subjects {
		if s == subject {
			return false
		}
	}
	w.subjects = append(w.subjects, subject)
	set := h.bySubject[subject]
	if set == nil {
		set = make(map[*waiter]struct{})
		h.bySubject[subject] = set
	}
	set[w] = struct{}{}
	return true
}

// leave ends the long poll w: it no longer counts against the bounds.
func (h *waitHub) leave(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range w.subjects {
		if set := h.bySubject[s]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(h.bySubject, s)
			}
		}
	}
	if h.byTenant[w.tenant]--; h.byTenant[w.tenant] <= 0 {
		delete(h.byTenant, w.tenant)
	}
	h.count--
	h.active.Add(context.Background(), -1)
}

// rereadAfter is how long a waiter sleeps before it reads its run again
// without an event: HARVEST_GATEWAY_WAIT_FALLBACK while the events can
// reach it, HARVEST_GATEWAY_WAIT_POLL while they cannot (no NATS, or NATS
// disconnected: events sent meanwhile are lost). Each sleep is up to a
// fifth shorter, at random, so that waits begun together (after a restart,
// say) do not all read together.
func (h *waitHub) rereadAfter() time.Duration {
	h.mu.Lock()
	nc, sub := h.nc, h.sub
	h.mu.Unlock()
	d := h.poll
	if sub != nil && nc.IsConnected() {
		d = h.fallback
	}
	return d - rand.N(d/5+1)
}

// close unsubscribes from the run events and releases every waiter.
// Waits that begin afterwards read their run once and answer.
func (h *waitHub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	close(h.released)
	sub := h.sub
	h.sub = nil
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}
