package tenantmove

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// mover is one move in progress.
type mover struct {
	o      Options
	tenant string
	leases *tenantcap.Leases
	rep    Report
	// lastWait is when the copy loop last reported a wait, so Progress
	// hears of waiting at most once a second.
	lastWait time.Time
	// capLogged is set once "waiting for capacity" was logged.
	capLogged bool
}

func move(ctx context.Context, o Options, tenant string, to int) (Report, error) {
	begun := time.Now()
	o = o.withDefaults()
	if len(o.Shards) == 0 {
		return Report{}, errors.New("tenantmove: no shards")
	}
	if to < 0 || to >= len(o.Shards) {
		return Report{}, fmt.Errorf("tenantmove: --to %d: must name one of the %d shards (0 to %d)",
			to, len(o.Shards), len(o.Shards)-1)
	}
	if err := validTenant(tenant); err != nil {
		return Report{}, err
	}
	unlock, err := lockTenant(ctx, o, tenant)
	if err != nil {
		return Report{}, err
	}
	defer unlock()

	dbs := make([]shard.Beginner, len(o.Shards))
	for i, p := range o.Shards {
		dbs[i] = p
	}
	leases, err := tenantcap.NewLeases(tenantcap.LeasesOptions{Shards: dbs, MaxRuns: o.MaxRuns})
	if err != nil {
		return Report{}, fmt.Errorf("tenantmove: %w", err)
	}
	m := &mover{o: o, tenant: tenant, leases: leases, rep: Report{Tenant: tenant, To: to}}

	e, err := directory.Get(ctx, o.Shards[0], tenant)
	if errors.Is(err, directory.ErrNoEntry) {
		e, err = directory.Place(ctx, o.Shards[0], tenant, shards.Home(tenant, len(o.Shards)))
	}
	if err != nil {
		return Report{}, fmt.Errorf("tenantmove: %w", err)
	}
	if err := m.checkRange(e); err != nil {
		return Report{}, err
	}
	switch {
	case e.Phase == directory.PhaseHome && e.Shard == to:
		m.rep.From = to
		m.rep.AlreadyHome = true
		m.rep.Elapsed = time.Since(begun)
		return m.rep, nil
	case e.Phase == directory.PhaseFencing && e.Target() != to,
		e.Phase == directory.PhaseCopying && e.Shard != to:
		x := e.Target()
		if e.Phase == directory.PhaseCopying {
			x = e.Shard
		}
		return Report{}, fmt.Errorf("tenantmove: a move of %s to shard %d is in progress; run `harvest tenants move %s --to %d` to finish it first",
			tenant, x, tenant, x)
	}
	if e.Phase == directory.PhaseHome {
		next := e
		next.Phase, next.MoveTo, next.MovingFrom, next.PlacedBy = directory.PhaseFencing, &to, nil, directory.PlacedByMove
		if e, err = m.update(ctx, next); err != nil {
			return Report{}, err
		}
		if err := m.step(Step{Name: "intent"}); err != nil {
			return m.rep, err
		}
	}
	if e.Phase == directory.PhaseFencing {
		if e, err = m.fenceAndPrepare(ctx, e); err != nil {
			return m.rep, err
		}
	}
	m.rep.From = e.From()
	if err := m.copyAll(ctx, e.From(), e.Shard); err != nil {
		return m.rep, err
	}
	if err := m.settle(ctx, e.From(), e.Shard); err != nil {
		return m.rep, err
	}
	if err := m.step(Step{Name: "settle"}); err != nil {
		return m.rep, err
	}
	next := e
	next.Phase, next.MoveTo, next.MovingFrom = directory.PhaseHome, nil, nil
	if _, err := m.update(ctx, next); err != nil {
		return m.rep, err
	}
	if err := m.step(Step{Name: "done"}); err != nil {
		return m.rep, err
	}
	m.rep.Elapsed = time.Since(begun)
	return m.rep, nil
}

// fenceAndPrepare runs the steps of phase fencing from S = e.Shard to
// D = e.MoveTo and switches the home to D. The deferred starts move
// before the switch (see moveDeferred), so that D holds the ids they
// reserve by the time it takes the tenant's starts.
func (m *mover) fenceAndPrepare(ctx context.Context, e directory.Entry) (directory.Entry, error) {
	src, dst := e.Shard, e.Target()
	m.rep.From = src
	if err := m.fence(ctx, src, dst); err != nil {
		return e, err
	}
	if err := m.step(Step{Name: "fence"}); err != nil {
		return e, err
	}
	away, err := m.prepare(ctx, src, dst)
	if err != nil {
		return e, err
	}
	if err := m.step(Step{Name: "prepare", Waiting: away}); err != nil {
		return e, err
	}
	n, err := m.moveDeferred(ctx, src, dst)
	if err != nil {
		return e, err
	}
	if err := m.step(Step{Name: "deferred", Runs: n}); err != nil {
		return e, err
	}
	next := e
	next.Shard, next.Phase, next.MoveTo, next.MovingFrom = dst, directory.PhaseCopying, nil, &src
	if e, err = m.update(ctx, next); err != nil {
		return e, err
	}
	return e, m.step(Step{Name: "switch"})
}

// checkRange refuses an entry naming a shard the caller does not have.
func (m *mover) checkRange(e directory.Entry) error {
	for _, s := range []int{e.Shard, e.From(), e.Target()} {
		if s >= len(m.o.Shards) {
			return fmt.Errorf("tenantmove: tenant %s: its entry names shard %d but only %d shards are configured",
				m.tenant, s, len(m.o.Shards))
		}
	}
	return nil
}

// update writes the entry and announces it. ErrStale means someone else
// changed the entry under the move's lock: a gateway never changes an
// entry it found, so that is another tool, and the move stops.
func (m *mover) update(ctx context.Context, e directory.Entry) (directory.Entry, error) {
	out, err := directory.Update(ctx, m.o.Shards[0], e)
	if err != nil {
		return directory.Entry{}, fmt.Errorf("tenantmove: %s: %w", m.tenant, err)
	}
	announce(ctx, m.o, out)
	return out, nil
}

// announce tells the gateways of the change; a lost hint only delays them
// by the directory's refresh, and the fences keep runs in place meanwhile.
func announce(ctx context.Context, o Options, e directory.Entry) {
	if err := directory.Announce(ctx, o.NATS, o.Prefix, e); err != nil {
		o.Log.Warn("tenantmove: announce the tenant's new entry", "tenant", e.Tenant, "err", err)
	}
}

// step reports a committed step to Progress and AfterStep.
func (m *mover) step(s Step) error {
	if m.o.Progress != nil {
		m.o.Progress(s)
	}
	if m.o.AfterStep != nil {
		if err := m.o.AfterStep(s); err != nil {
			return err
		}
	}
	return nil
}

// lockTenant takes the tenant's move lock on a connection of its own and
// returns what releases it: closing the connection, so the lock can never
// go back to the pool with it.
func lockTenant(ctx context.Context, o Options, tenant string) (func(), error) {
	c, err := o.Shards[0].Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenantmove: connect to shard 0: %w", err)
	}
	var got bool
	if err := c.QueryRow(ctx, sqlMoveLockTry, tenant).Scan(&got); err != nil {
		c.Release()
		return nil, fmt.Errorf("tenantmove: take the move lock: %w", err)
	}
	conn := c.Hijack()
	closeConn := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}
	if !got {
		closeConn()
		return nil, fmt.Errorf("tenantmove: a move of %s is already running", tenant)
	}
	return func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Closing would free the lock too, but not at once.
		_, _ = conn.Exec(cctx, sqlMoveLockRelease, tenant)
		closeConn()
	}, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
