package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// getRun reads what an id of the tenant stands for (deferred.Get): a run,
// or a deferred start, shown as the run it will fire (status deferred,
// fires_at) or fired. With wait > 0 it waits until the run is final or the
// wait ends, and answers as things then stand.
//
// A wait is a waiter of the gateway's waitHub: it counts against the
// bounds of long polls (HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT and
// HARVEST_GATEWAY_MAX_WAITERS) and is woken by the run's NATS event (under
// the id asked for and under the run's own id, when a debounce or batch
// start's id was asked for), after which it reads the run again. It
// rereads now and then besides (waitHub.rereadAfter), so a lost event
// costs latency only, and once more when the wait ends. Each read goes
// through readMoving, so a wait that spans a move of its tenant follows
// the run to its new home; the event subject names no shard.
//
// A wait past a bound reads the run once instead: a final run (or an
// error) is answered as the wait would have answered it at once; a run
// not final yet gets 429 over_limit with retry_after_ms. It is not
// answered 200 as it stands, since a client that waits in a loop (the Go
// client's Wait) would ask again at once, hot, instead of backing off.
//
// The answer of a run that waits to be claimed (queued, or deferred)
// carries Waiting, why it waits (runstore.Waiting), read from the shard
// that answered. A long poll reads it only for its last answer, not for
// each read (and not at all when the gateway's close cuts the wait short).
// A failure to read it is logged and leaves it out: the run itself was
// read.
func (g *Gateway) getRun(ctx context.Context, tenant, id string, wait time.Duration) (api.Run, *api.Error) {
	readOnce := func(ctx context.Context, explain bool) (api.Run, *api.Error) {
		run, shard, err := g.readMoving(ctx, tenant, func(ctx context.Context, shard int) (api.Run, error) {
			run, err := deferred.Get(ctx, g.shards[shard], tenant, id, shard)
			if err == nil && explain {
				g.fillWaiting(ctx, shard, &run)
			}
			return run, err
		})
		if err != nil {
			return api.Run{}, g.apiError(err, shard, "read run")
		}
		return run, nil
	}
	read := func(ctx context.Context) (api.Run, *api.Error) { return readOnce(ctx, true) }
	if wait <= 0 {
		return read(ctx)
	}
	h := g.waits
	w, refused, bound := h.enter(ctx, tenant)
	if refused != nil {
		run, e := readOnce(ctx, false)
		if e != nil || run.Status.Final() {
			return run, e
		}
		h.refuse(ctx, tenant, bound)
		return api.Run{}, refused
	}
	if w == nil {
		// The gateway is closing: no more waits.
		return read(ctx)
	}
	defer h.leave(w)
	// Listen before the first read, so an event sent between the read and
	// the sleep is not missed; and make sure there will be an event (a
	// run is announced only when asked), before the read too, so that a
	// run found unfinished announces its end.
	h.listen(w, g.subjects.Runs(tenant, id))
	g.askForEvent(ctx, tenant, id)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	reread := time.NewTimer(time.Hour)
	defer reread.Stop()
	end := waitEndFirstRead
	for {
		run, e := readOnce(ctx, false)
		if e != nil || run.Status.Final() {
			h.steps.Signal(waitStep{ID: id, Step: end})
			return run, e
		}
		if run.RunID != "" && run.RunID != id && h.listen(w, g.subjects.Runs(tenant, run.RunID)) {
			// A debounce or batch start: its run's events go out under
			// the run's id, heard from now on. Read once more, for the
			// run may have ended before.
			g.askForEvent(ctx, tenant, run.RunID)
			continue
		}
		reread.Reset(h.rereadAfter())
		h.steps.Signal(waitStep{ID: id, Step: waitAsleep})
		select {
		case <-w.wake:
			end = waitEndEvent
		case <-reread.C:
			end = waitEndReread
		case <-deadline.C:
			h.steps.Signal(waitStep{ID: id, Step: waitEndDeadline})
			return read(ctx)
		case <-h.released:
			// The gateway closes: answer what is known now, without
			// another read (the pools close next); the client asks
			// again, of another gateway.
			h.steps.Signal(waitStep{ID: id, Step: waitEndClosed})
			return run, nil
		case <-ctx.Done():
			return run, nil
		}
	}
}

// askForEvent makes the tenant's run id announce its end
// (runstore.Notify), for a long poll about to wait for that event: on the
// tenant's home and, while the tenant moves, on the home it leaves (the
// run is on one of them; a run copied meanwhile may lose the request,
// which costs that wait its event). A failure is logged and the wait
// goes on: it rereads the run now and then, so the event only saves
// latency.
func (g *Gateway) askForEvent(ctx context.Context, tenant, id string) {
	e, ae := g.entry(ctx, tenant)
	if ae != nil {
		return // the wait's read answers the same error
	}
	shards := []int{e.Shard}
	if from := e.From(); from >= 0 {
		shards = append(shards, from)
	}
	for _, shard := range shards {
		if _, err := runstore.Notify(ctx, g.shards[shard], tenant, id); err != nil && ctx.Err() == nil {
			g.log.Warn("a long poll could not ask for its run's event; it rereads the run instead",
				"shard", shard, "err", err)
		}
	}
}

// fillWaiting sets run.Waiting when the run waits to be claimed: queued,
// or deferred (the run of a deferred start, by its own id). Only the read
// of one run asks it; listings stay cheap.
func (g *Gateway) fillWaiting(ctx context.Context, shard int, run *api.Run) {
	if run.Status != api.StatusQueued && run.Status != api.StatusDeferred {
		return
	}
	runID := run.ID
	if run.RunID != "" {
		runID = run.RunID
	}
	w, err := runstore.Waiting(ctx, g.shards[shard], run.Tenant, runID)
	if err != nil {
		if !errors.Is(err, runstore.ErrNotFound) && ctx.Err() == nil {
			g.log.Warn("cannot tell why a run waits", "shard", shard, "err", err)
		}
		return
	}
	run.Waiting = w
}

// listRuns returns a page of the tenant's runs from its home shard. While
// the tenant moves, that is the new home: runs not copied yet show once
// they are (docs/operations.md). A tenant past its bound of listings in
// flight is answered 429 (listBound).
func (g *Gateway) listRuns(ctx context.Context, p runstore.ListParams) (api.RunList, *api.Error) {
	e, ae := g.entry(ctx, p.Tenant)
	if ae != nil {
		return api.RunList{}, ae
	}
	p.Shard = e.Shard
	if ae := g.lists.enter(ctx, p.Tenant); ae != nil {
		return api.RunList{}, ae
	}
	defer g.lists.leave(p.Tenant)
	res, err := runstore.List(ctx, g.shards[p.Shard], p)
	if err != nil {
		return api.RunList{}, g.apiError(err, p.Shard, "list runs")
	}
	return api.RunList{Runs: res.Runs, NextCursor: res.NextCursor}, nil
}

// cancelRun cancels what an id of the tenant stands for (deferred.Cancel):
// a run, a throttled start (waiting or fired), or the one run of a debounce
// window or batch, by any of its starts' ids. A cancel is announced on the
// run's event subject, under the run's own id (a worker holding its task
// learns of it at its next heartbeat) and, for a start's id, under that id
// too, for those waiting on it; like every run event, only for a run that
// asked to be announced (api.StartRequest.Notify, or a long poll on it).
//
// A run being copied to its tenant's new home cannot be cancelled until
// the copy has it (runstore.ErrRunMoving): the cancel waits for that,
// then goes to the new home.
func (g *Gateway) cancelRun(ctx context.Context, tenant, id, reason string) (api.Run, *api.Error) {
	var res runstore.CancelResult
	cancel := func(ctx context.Context, shard int) (api.Run, error) {
		var err error
		res, err = deferred.Cancel(ctx, g.shards[shard], tenant, id, shard, reason)
		return res.Run, err
	}
	if shard, err := g.whileMoving(ctx, tenant, cancel); err != nil {
		return api.Run{}, g.movingAPIError(err, tenant, shard, "cancel run")
	}
	if res.Cancelled && res.Notify {
		ev := res.Run
		if ev.RunID != "" && ev.RunID != ev.ID {
			g.publishRun(ctx, ev)
			ev.ID = ev.RunID
		}
		g.publishRun(ctx, ev)
	}
	return res.Run, nil
}

// errStillMoving means whileMoving gave up: the run was still being
// copied to its tenant's new home after movedAttempts tries.
var errStillMoving = errors.New("gateway: the run is still being copied")

// whileMoving runs write on what the tenant's id stands for (readMoving)
// and, while a move keeps the run from being written (a run being copied,
// runstore.ErrRunMoving, or a shard that fenced the tenant away), waits a
// little and tries again, up to movedAttempts: the copy of a batch takes
// about a second. It returns the shard that answered last and the error
// of the last try (errStillMoving when it gave up).
func (g *Gateway) whileMoving(ctx context.Context, tenant string, write func(ctx context.Context, shard int) (api.Run, error)) (int, error) {
	wait := movedFirstWait
	for attempt := 1; ; attempt++ {
		_, shard, err := g.readMoving(ctx, tenant, write)
		if err == nil || (!errors.Is(err, runstore.ErrRunMoving) && runstore.AsMoved(err) == nil) {
			return shard, err
		}
		if attempt == movedAttempts {
			return shard, errStillMoving
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return shard, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, movedMaxWait)
	}
}

// movingAPIError is the answer to an error of whileMoving.
func (g *Gateway) movingAPIError(err error, tenant string, shard int, what string) *api.Error {
	if errors.Is(err, errStillMoving) {
		return movingError(tenant, "this run is being copied")
	}
	return g.apiError(err, shard, what)
}

// countRefused counts a start refused before it reached the start path
// (unreadable body, too large, bad subject).
func (g *Gateway) countRefused(ctx context.Context, transport string, e *api.Error) {
	g.starts.Add(ctx, 1, g.outcomeOption(transport, string(e.Code)))
}
