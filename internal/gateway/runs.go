package gateway

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// getRun reads the tenant's run; with wait > 0 it waits until the run is
// final or the wait ends, and answers the run as it then stands. It wakes
// on the run's NATS event and rereads every WaitPoll besides, so a lost
// event costs at most one poll.
func (g *Gateway) getRun(ctx context.Context, tenant, id string, wait time.Duration) (api.Run, *api.Error) {
	shard := g.home(tenant)
	pool := g.shards[shard]
	read := func(ctx context.Context) (api.Run, *api.Error) {
		run, err := runstore.Get(ctx, pool, tenant, id, shard)
		if err != nil {
			return api.Run{}, g.apiError(err, shard, "read run")
		}
		return run, nil
	}
	if wait <= 0 {
		return read(ctx)
	}
	// Listen before the first read, so an event sent between the read and
	// the wait is not missed.
	events := make(chan struct{}, 1)
	if g.nc != nil {
		sub, err := g.nc.Subscribe(g.subjects.Runs(tenant, id), func(*nats.Msg) {
			select {
			case events <- struct{}{}:
			default:
			}
		})
		if err == nil {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(g.cfg.WaitPoll)
	defer poll.Stop()
	for {
		run, e := read(ctx)
		if e != nil || run.Status.Final() {
			return run, e
		}
		select {
		case <-events:
		case <-poll.C:
		case <-deadline.C:
			return read(ctx)
		case <-ctx.Done():
			return run, nil
		}
	}
}

// listRuns returns a page of the tenant's runs from its home shard.
func (g *Gateway) listRuns(ctx context.Context, p runstore.ListParams) (api.RunList, *api.Error) {
	p.Shard = g.home(p.Tenant)
	res, err := runstore.List(ctx, g.shards[p.Shard], p)
	if err != nil {
		return api.RunList{}, g.apiError(err, p.Shard, "list runs")
	}
	return api.RunList{Runs: res.Runs, NextCursor: res.NextCursor}, nil
}

// cancelRun cancels the tenant's run and announces it on the run's event
// subject (a worker holding its task learns of it at its next heartbeat).
func (g *Gateway) cancelRun(ctx context.Context, tenant, id, reason string) (api.Run, *api.Error) {
	shard := g.home(tenant)
	res, err := runstore.Cancel(ctx, g.shards[shard], tenant, id, shard, reason)
	if err != nil {
		return api.Run{}, g.apiError(err, shard, "cancel run")
	}
	if res.Cancelled {
		g.publishRun(ctx, res.Run)
	}
	return res.Run, nil
}

// countRefused counts a start refused before it reached the start path
// (unreadable body, too large, bad subject).
func (g *Gateway) countRefused(ctx context.Context, transport string, e *api.Error) {
	g.starts.Add(ctx, 1, metric.WithAttributes(attribute.String("transport", transport), attribute.String("outcome", string(e.Code))))
}
