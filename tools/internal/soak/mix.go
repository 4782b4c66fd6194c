package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
)

// Keys and priority of the mixed load's watched work (monitor.go). They
// live on the first tenant's home shard, where the monitor reads them.
const (
	// PairHeavy and PairLight are the weighted pair: PairHeavy weighs
	// PairWeight, PairLight 1. Only the load's bursts use them.
	PairHeavy  = "pair-heavy"
	PairLight  = "pair-light"
	PairWeight = 4.0
	// UrgentKey holds the priority band: probe runs at UrgentPriority.
	UrgentKey      = "urgent"
	UrgentPriority = 5
)

// MeteredQuota is the quota key of one run in twenty of the mixed load: a
// concurrency cap and a rate of twice their arrival rate, so that its
// rechecks refuse now and then but its backlog drains. (The plain load's
// trickle, whose quota admits one claim in all, is left out: its backlog
// grows without end and every claim of the queue steps over it; see
// docs/reliability.md, "What breaks first".)
const MeteredQuota = "metered"

// burstEvery is the time between two bursts of the weighted pair.
const burstEvery = 15 * time.Second

// mixedRequest builds start n of the mixed load: what users run, by n
// modulo 20.
func (l *Load) mixedRequest(n int64) (string, bool, api.StartRequest) {
	tenants := l.f.opts.Tenants
	tenant := tenants[int(n)%len(tenants)]
	viaNATS := (n/int64(len(tenants)))%2 == 1
	key := fmt.Sprintf("k%d", n%5)
	maxAttempts := 5
	// Announced, as the soak's runs are: the check counts each run's final
	// events, and the mix's figures include what the events cost.
	req := api.StartRequest{ID: fmt.Sprintf("%s-%06d", l.tag, n), Queue: Queue, FairnessKey: &key,
		MaxAttempts: &maxAttempts, Notify: true}
	switch m := n % 20; {
	case m < 4: // short tasks
		req.Name, req.Input = "sleep", fmt.Appendf(nil, `{"ms":%d}`, 50+n%5*50)
	case m == 4: // a long task
		req.Name, req.Input = "sleep", json.RawMessage(`{"ms":2000}`)
	case m < 7: // retries that succeed; one in forty runs out of attempts
		times := n % 3
		if n%40 == 5 {
			times = 9
		}
		req.Name, req.Input = "fail", fmt.Appendf(nil, `{"times":%d}`, times)
	case m < 11: // continuations
		req.Name, req.Input = "steps", json.RawMessage(`{"n":3,"ms":20}`)
	case m < 14: // work served over the NATS bridge
		req.Name, req.Input = "probe", fmt.Appendf(nil, `{"ms":%d}`, 100+n%4*50)
	case m == 14: // a deferred start
		d := api.Duration(time.Duration(1+n%5) * time.Second)
		req.Name, req.Input, req.Delay = "sleep", json.RawMessage(`{"ms":50}`), &d
	case m == 15: // cancelled once started (acked)
		req.Name, req.Input = "sleep", json.RawMessage(`{"ms":3000}`)
	case m == 16: // the priority band, on the watched shard
		uk := UrgentKey
		req.Name, req.Priority, req.FairnessKey = "probe", UrgentPriority, &uk
		req.Input = fmt.Appendf(nil, `{"ms":20,"key":%q}`, UrgentKey)
		tenant = tenants[0]
	case m == 19: // under a quota that caps it and meters it
		quota := MeteredQuota
		req.Name, req.Input, req.QuotaKey = "sleep", json.RawMessage(`{"ms":20}`), &quota
	default:
		req.Name, req.Input = "sleep", json.RawMessage(`{"ms":20}`)
	}
	return tenant, viaNATS, req
}

// cancelled reports whether the mixed load cancels start n once it is
// acknowledged.
func cancelled(req api.StartRequest) bool {
	return req.Name == "sleep" && string(req.Input) == `{"ms":3000}`
}

// acked is called once a start is acknowledged: the mixed load cancels
// the runs it means to cancel and tells the monitor of watched ones.
func (l *Load) acked(tenant string, req api.StartRequest, shard int) {
	if !l.opts.Mixed {
		return
	}
	if m := l.opts.Monitor; m != nil && req.FairnessKey != nil {
		switch *req.FairnessKey {
		case UrgentKey:
			m.urgentAcked(tenant+"/"+req.ID, shard)
		case PairHeavy, PairLight:
			m.watched(shard)
		}
	}
	if !cancelled(req) {
		return
	}
	deadline := time.Now().Add(l.opts.RetryFor)
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		_, err := l.f.Tenant(tenant, try%l.f.Gateways()).Cancel(ctx, req.ID)
		cancel()
		var ae *api.Error
		if err == nil || (errors.As(err, &ae) && ae.Status == http.StatusConflict) {
			l.mu.Lock()
			l.cancels++
			l.mu.Unlock()
			return // cancelled, or it finished first
		}
		if time.Now().After(deadline) || l.ctx.Err() != nil {
			return // the run ends by itself: it is a 3 s sleep
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-l.ctx.Done():
			return
		}
	}
}

// bursts sends, every burstEvery, a burst of the weighted pair: four heavy
// starts for each light one, all due at the same instant a few seconds on,
// so that both keys have a backlog at once however fast the fleet is, and
// the monitor can watch them share the claims.
func (l *Load) bursts() {
	defer l.wg.Done()
	t := time.NewTicker(burstEvery)
	defer t.Stop()
	sem := make(chan struct{}, l.opts.Inflight)
	tenant := l.f.opts.Tenants[0]
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		// Twice the rate's light starts: a burst of ten seconds' starts.
		light := max(25, int(2*l.Rate()))
		due := api.Time{Time: time.Now().Add(4 * time.Second)}
		for i := range light * int(PairWeight+1) {
			key := PairHeavy
			if i%int(PairWeight+1) == 0 {
				key = PairLight
			}
			n := l.seq.Add(1)
			maxAttempts := 5
			req := api.StartRequest{ID: fmt.Sprintf("%s-%06d", l.tag, n), Name: "probe", Queue: Queue,
				FairnessKey: &key, MaxAttempts: &maxAttempts, RunAt: &due, Notify: true,
				Input: fmt.Appendf(nil, `{"ms":5,"key":%q}`, key)}
			select {
			case sem <- struct{}{}:
			case <-l.stop:
				return
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-sem }()
				l.send(n, tenant, n%2 == 1, req)
			}()
		}
	}
}
