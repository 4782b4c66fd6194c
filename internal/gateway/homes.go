package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// Bounds of the wait for a tenant's new home. A start refused by a fenced
// shard is sent again once the directory names another home; between the
// fence and the switch of a move (two short transactions) the directory
// still names the old one, so the gateway waits a little and reads again.
const (
	movedFirstWait = 20 * time.Millisecond
	movedMaxWait   = 400 * time.Millisecond
	// movedHold bounds how long a start is held for the switch: the
	// steps between a move's fence and its switch (the fairness state,
	// the deferred starts) take well under a second at the sizes
	// measured in docs/operations.md.
	movedHold = 10 * time.Second
	// movedAttempts bounds the tries of a cancel of a run being copied.
	movedAttempts = 8
	// notFoundReload is the least age of a cached entry that a run not
	// found makes the gateway read again: anyone can ask for ids that do
	// not exist, and shard 0 should not pay a read for each.
	notFoundReload = time.Second
	// movingRetryAfter is what a refusal during a move asks the caller to
	// wait: about one copy batch.
	movingRetryAfter = time.Second
)

// entry returns the tenant's directory entry (cached, or read or placed on
// shard 0). A directory that cannot be read is a 503: the tenant's home is
// unknown, and guessing it could put a run where no gateway looks.
func (g *Gateway) entry(ctx context.Context, tenant string) (directory.Entry, *api.Error) {
	e, err := g.dir.Home(ctx, tenant)
	if err != nil {
		return directory.Entry{}, g.directoryError(err, tenant)
	}
	return e, nil
}

// reloadEntry reads the tenant's entry from shard 0 again, whatever the
// cache holds.
func (g *Gateway) reloadEntry(ctx context.Context, tenant string) (directory.Entry, *api.Error) {
	e, err := g.dir.Reload(ctx, tenant)
	if err != nil {
		return directory.Entry{}, g.directoryError(err, tenant)
	}
	return e, nil
}

func (g *Gateway) directoryError(err error, tenant string) *api.Error {
	if errors.Is(err, context.Canceled) {
		return api.NewError(api.CodeUnavailable, "the request was cancelled before it finished")
	}
	g.log.Warn("gateway: tenant directory", "tenant", tenant, "err", err)
	return api.NewError(api.CodeUnavailable, "the home shard of tenant %s cannot be looked up (the directory on shard 0 did not answer); try again later", tenant)
}

// awaitNewHome reads the entry again until it names a home other than
// fenced (the shard that refused the tenant's start), waiting a little
// between reads, and returns it: the start is held, not refused, while a
// move goes from its fence to its switch. ok is false when the directory
// did not change within movedHold or ctx ended.
func (g *Gateway) awaitNewHome(ctx context.Context, tenant string, fenced int) (directory.Entry, bool) {
	wait := movedFirstWait
	deadline := time.Now().Add(movedHold)
	for {
		e, ae := g.reloadEntry(ctx, tenant)
		if ae == nil && e.Shard != fenced {
			return e, true
		}
		if time.Now().After(deadline) {
			return directory.Entry{}, false
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return directory.Entry{}, false
		case <-t.C:
		}
		wait = min(2*wait, movedMaxWait)
	}
}

// movingError answers a call the move of the tenant keeps from being
// served right now.
func movingError(tenant, what string) *api.Error {
	e := api.NewError(api.CodeUnavailable, "tenant %s is moving to another shard: %s; try again shortly", tenant, what)
	e.RetryAfterMS = movingRetryAfter.Milliseconds()
	return e
}

// readMoving reads what id stands for on the tenant's home and, during a
// move, on the old home when the new one does not hold it yet. A run not
// found on a home the directory may have moved away from is looked up
// again after one fresh read of the entry, so a gateway whose cache missed
// a move still finds the run.
func (g *Gateway) readMoving(ctx context.Context, tenant string, read func(ctx context.Context, shard int) (api.Run, error)) (api.Run, int, error) {
	e, ae := g.entry(ctx, tenant)
	if ae != nil {
		return api.Run{}, -1, ae
	}
	run, err := read(ctx, e.Shard)
	if !errors.Is(err, runstore.ErrNotFound) {
		return run, e.Shard, err
	}
	if from := e.From(); from >= 0 {
		if run, err := read(ctx, from); !errors.Is(err, runstore.ErrNotFound) {
			return run, from, err
		}
		// Copied and dropped between the two reads: the new home has it.
		run, err = read(ctx, e.Shard)
		return run, e.Shard, err
	}
	if fresh, err := g.dir.ReloadStale(ctx, tenant, notFoundReload); err == nil && fresh.Version != e.Version {
		return g.readMovingOnce(ctx, fresh, read)
	}
	return run, e.Shard, err
}

// readMovingOnce is readMoving's lookup for an entry just read.
func (g *Gateway) readMovingOnce(ctx context.Context, e directory.Entry, read func(ctx context.Context, shard int) (api.Run, error)) (api.Run, int, error) {
	run, err := read(ctx, e.Shard)
	if from := e.From(); errors.Is(err, runstore.ErrNotFound) && from >= 0 {
		if run, err := read(ctx, from); !errors.Is(err, runstore.ErrNotFound) {
			return run, from, err
		}
		run, err = read(ctx, e.Shard)
	}
	return run, e.Shard, err
}
