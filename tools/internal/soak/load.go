package soak

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// LoadOptions shape a Load.
type LoadOptions struct {
	// Rate is the number of new starts per second over all tenants
	// (default 30).
	Rate float64
	// Probe adds runs of the probe workflow, served by the harness over
	// the worker's NATS bridge. Leave it off while NATS itself is broken:
	// a bridged attempt fails at once without a server and would burn its
	// attempts.
	Probe bool
	// RetryFor bounds how long one start is sent again before the load
	// gives up on it (default 90s). A start given up is simply not
	// acknowledged.
	RetryFor time.Duration
	// Inflight bounds the starts in progress (default 64).
	Inflight int
	// Mixed is the soak's workload (mix.go): besides the kinds above, long
	// tasks, deferred starts, runs cancelled after their start, failures
	// that exhaust their attempts, a priority band, and bursts of a
	// weighted pair of keys that the monitor watches. Off, the load is
	// what the fault tests expect.
	Mixed bool
	// Monitor, when set with Mixed, is told of the load's urgent and pair
	// starts.
	Monitor *Monitor
}

// Ack is an acknowledged start.
type Ack struct {
	Tenant  string
	ID      string
	Name    string
	Shard   int
	Created bool   // 201; false for a replay (200)
	Via     string // "http" or "nats"
	Tries   int
}

// Load sends starts from every tenant, alternately over HTTP and NATS,
// until Stop. Every start has its own id and is sent again, with the same
// id and request, until a gateway acknowledges it.
type Load struct {
	f    *Fleet
	opts LoadOptions
	tag  string
	nc   *nats.Conn
	nats map[string]*client.Client

	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
	seq    atomic.Int64
	rate   atomic.Uint64 // float64 bits

	mu       sync.Mutex
	acks     []Ack
	problems []string
	// serverErrors are 5xx answers other than 503 (each start was sent
	// again and is judged by its final answer).
	serverErrors []string
	retries      int
	giveups      int
	cancels      int
}

// StartLoad begins a load on the fleet.
func (f *Fleet) StartLoad(opts LoadOptions) (*Load, error) {
	if opts.Rate <= 0 {
		opts.Rate = 30
	}
	if opts.RetryFor <= 0 {
		opts.RetryFor = 90 * time.Second
	}
	if opts.Inflight <= 0 {
		opts.Inflight = 64
	}
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	nc, err := natsconn.Connect(f.natsURL, natsconn.Options{Name: "harvest-soak-load"})
	if err != nil {
		return nil, err
	}
	l := &Load{f: f, opts: opts, tag: hex.EncodeToString(tag[:]), nc: nc, nats: map[string]*client.Client{}, stop: make(chan struct{})}
	l.SetRate(opts.Rate)
	for _, t := range f.opts.Tenants {
		c, err := client.New(client.Options{NATS: nc, Tenant: t, NATSTimeout: 5 * time.Second})
		if err != nil {
			nc.Close()
			return nil, err
		}
		l.nats[t] = c
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.run()
	if opts.Mixed {
		l.wg.Add(1)
		go l.bursts()
	}
	return l, nil
}

func (l *Load) run() {
	defer l.wg.Done()
	sem := make(chan struct{}, l.opts.Inflight)
	// Starts are sent in steps of 10ms, as many as the rate owes by then,
	// so a high rate needs no timer per start and a change of rate
	// (SetRate) applies from the next step.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	owed := 0.0
	for {
		select {
		case <-l.stop:
			return
		case now := <-tick.C:
			owed += l.Rate() * now.Sub(last).Seconds()
			last = now
		}
		for ; owed >= 1; owed-- {
			select {
			case sem <- struct{}{}:
			case <-l.stop:
				return
			}
			n := l.seq.Add(1)
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-sem }()
				l.one(n)
			}()
		}
	}
}

// Rate is the load's current starts per second.
func (l *Load) Rate() float64 { return math.Float64frombits(l.rate.Load()) }

// SetRate changes the starts per second from the next step on.
func (l *Load) SetRate(r float64) { l.rate.Store(math.Float64bits(r)) }

// request builds start number n: its tenant, transport and request.
func (l *Load) request(n int64) (string, bool, api.StartRequest) {
	if l.opts.Mixed {
		return l.mixedRequest(n)
	}
	tenants := l.f.opts.Tenants
	tenant := tenants[int(n)%len(tenants)]
	trickle := n%15 == 2
	if trickle {
		tenant = tenants[0]
	}
	viaNATS := (n/int64(len(tenants)))%2 == 1
	key := fmt.Sprintf("k%d", n%5)
	maxAttempts := 5
	// Announced: the check counts each run's final events.
	req := api.StartRequest{ID: fmt.Sprintf("%s-%06d", l.tag, n), Queue: Queue, FairnessKey: &key,
		MaxAttempts: &maxAttempts, Notify: true}
	kinds := 3
	if l.opts.Probe {
		kinds = 4
	}
	switch {
	case trickle:
		// A run the trickle quota holds back.
		quota, tk := TrickleQuota, TrickleKey
		req.Name, req.QuotaKey, req.FairnessKey = "echo", &quota, &tk
		req.Input = json.RawMessage(`{"trickle":true}`)
	default:
		switch n % int64(kinds) {
		case 0:
			req.Name, req.Input = "sleep", fmt.Appendf(nil, `{"ms":%d}`, 50+n%5*50)
		case 1:
			req.Name, req.Input = "fail", fmt.Appendf(nil, `{"times":%d}`, n%2)
		case 2:
			req.Name, req.Input = "steps", json.RawMessage(`{"n":3,"ms":20}`)
		case 3:
			req.Name, req.Input = "probe", fmt.Appendf(nil, `{"ms":%d}`, 100+n%4*50)
		}
	}
	return tenant, viaNATS, req
}

// one sends start n until it is acknowledged, refused for good, or its
// retry time is over.
func (l *Load) one(n int64) {
	tenant, viaNATS, req := l.request(n)
	l.send(n, tenant, viaNATS, req)
}

// send sends req until it is acknowledged, refused for good, or its retry
// time is over.
func (l *Load) send(n int64, tenant string, viaNATS bool, req api.StartRequest) {
	deadline := time.Now().Add(l.opts.RetryFor)
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		var c *client.Client
		via := "http"
		if viaNATS {
			c, via = l.nats[tenant], "nats"
		} else {
			c = l.f.Tenant(tenant, (int(n)+try)%l.f.Gateways())
		}
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		st, err := c.StartRequest(ctx, req)
		cancel()
		if err == nil {
			l.mu.Lock()
			if st.Run.ID != req.ID || st.Run.Tenant != tenant {
				l.problems = append(l.problems, fmt.Sprintf("start %s/%s answered run %s/%s", tenant, req.ID, st.Run.Tenant, st.Run.ID))
			}
			l.acks = append(l.acks, Ack{Tenant: tenant, ID: req.ID, Name: req.Name, Shard: st.Run.Shard, Created: st.Created, Via: via, Tries: try})
			l.mu.Unlock()
			l.acked(tenant, req, st.Run.Shard)
			return
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			switch ae.Status {
			case http.StatusTooManyRequests, http.StatusServiceUnavailable:
				// Retry: admission or a shard said "later".
			default:
				msg := fmt.Sprintf("start %s/%s (try %d over %s): %d %s: %s", tenant, req.ID, try, via, ae.Status, ae.Code, ae.Message)
				l.mu.Lock()
				if ae.Status >= 500 {
					// Sent again below: the start is not lost, but the
					// answer should have been 503 (see ServerErrors).
					l.serverErrors = append(l.serverErrors, msg)
				} else {
					l.problems = append(l.problems, msg)
				}
				l.mu.Unlock()
				if ae.Status < 500 {
					return
				}
			}
		}
		if time.Now().After(deadline) || l.ctx.Err() != nil {
			l.mu.Lock()
			l.giveups++
			l.mu.Unlock()
			return
		}
		l.mu.Lock()
		l.retries++
		l.mu.Unlock()
		select {
		case <-time.After(retryWait(err, backoff)):
		case <-l.ctx.Done():
		}
		backoff = min(2*backoff, time.Second)
	}
}

// retryWait is the wait before a start is sent again: its backoff, or,
// when the gateway asked for longer (Retry-After, retry_after_ms: it sheds
// load), that wait plus up to half again at random, so that the starts it
// refused together do not all come back together.
func retryWait(err error, backoff time.Duration) time.Duration {
	var ce *client.Error
	if errors.As(err, &ce) {
		if ra := ce.RetryAfter(); ra > backoff {
			return ra + mrand.N(ra/2+1)
		}
	}
	return backoff
}

// Stop ends the load: no new starts, and the starts in progress are sent
// until acknowledged or their retry time is over.
func (l *Load) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.cancel()
	l.nc.Close()
}

// Abort ends the load at once, giving up on starts in progress.
func (l *Load) Abort() {
	l.cancel()
	l.Stop()
}

// Acked returns the acknowledged starts so far.
func (l *Load) Acked() []Ack {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Ack(nil), l.acks...)
}

// Problems are answers no correct gateway gives (a 400 or 409 to the
// load's own well-formed starts and their replays, a 5xx other than 503).
func (l *Load) Problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...)
}

// ServerErrors are the 5xx answers other than 503 the load got. A gateway
// should answer 503 when a shard is unreachable; each of these starts was
// sent again, so none is lost, but the answer was wrong.
func (l *Load) ServerErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.serverErrors...)
}

// Stats are the load's counters.
func (l *Load) Stats() (sent int64, acked, retries, giveups int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq.Load(), len(l.acks), l.retries, l.giveups
}

// Cancels is how many runs the mixed load cancelled (or found finished
// when it tried).
func (l *Load) Cancels() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cancels
}

// WaitAcked waits until at least n starts are acknowledged.
func (l *Load) WaitAcked(ctx context.Context, n int) error {
	return waitFor(ctx, time.Minute, func() (bool, error) {
		_, a, _, _ := l.Stats()
		return a >= n, nil
	}, "acknowledged starts")
}

// waitFor polls cond every 50ms until it holds, returns an error or the
// timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error), what string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("soak: waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
