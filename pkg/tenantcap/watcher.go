package tenantcap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/shard"
)

// WatcherOptions configure a Watcher.
type WatcherOptions struct {
	// Shard0 is where the configuration lives. Required.
	Shard0 shard.Querier
	// NATS, when set, delivers change announcements on Subject(Prefix).
	NATS   *nats.Conn
	Prefix string
	// Reload is the period of the fallback re-read (DefaultReload when
	// zero): a lost announcement delays a change by at most this much.
	Reload time.Duration
	// Log receives failed reloads; slog.Default when nil.
	Log *slog.Logger
	// OnChange, when set, sees every configuration put in force.
	OnChange func(Current)
}

// Watcher keeps the configuration in force in a gateway: it loads the
// persisted one at Start, re-reads shard 0 whenever a change is announced
// and every Reload period, and serves the result to the next start without
// touching the database. It is safe for concurrent use.
type Watcher struct {
	o        WatcherOptions
	cur      atomic.Pointer[Current]
	ceilings atomic.Pointer[Ceilings]
	mu       sync.Mutex // serialises Apply's compare and swap
	// reloadMu orders reloads: a read of the ceilings that began later is
	// put in force later, so a slow reload never undoes a newer one.
	reloadMu sync.Mutex
	stop     context.CancelFunc
	done     chan struct{}
	sub      *nats.Subscription
}

// NewWatcher returns a watcher serving DefaultConfig until Start.
func NewWatcher(o WatcherOptions) *Watcher {
	if o.Reload <= 0 {
		o.Reload = DefaultReload
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	w := &Watcher{o: o}
	w.cur.Store(&Current{Config: DefaultConfig()})
	w.ceilings.Store(&Ceilings{})
	return w
}

// Start loads the persisted configuration (an error if shard 0 cannot be
// read: the gateway should not admit under a configuration it does not
// know), subscribes to announcements and starts the periodic reload, which
// ends with ctx or Stop.
func (w *Watcher) Start(ctx context.Context) error {
	if w.o.Shard0 == nil {
		return errors.New("tenantcap: a Watcher needs shard 0")
	}
	if err := w.Reload(ctx); err != nil {
		return err
	}
	ctx, w.stop = context.WithCancel(ctx)
	w.done = make(chan struct{})
	if w.o.NATS != nil {
		sub, err := w.o.NATS.Subscribe(Subject(w.o.Prefix), func(msg *nats.Msg) {
			rctx, cancel := context.WithTimeout(dispatch.Extract(ctx, msg), 5*time.Second)
			defer cancel()
			if err := w.Reload(rctx); err != nil && ctx.Err() == nil {
				w.o.Log.Warn("admission: reload after announcement failed", "err", err)
			}
		})
		if err != nil {
			w.stop()
			return fmt.Errorf("tenantcap: subscribe %s: %w", Subject(w.o.Prefix), err)
		}
		w.sub = sub
	}
	go w.loop(ctx)
	return nil
}

func (w *Watcher) loop(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(w.o.Reload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.Reload(ctx); err != nil && ctx.Err() == nil {
				w.o.Log.Warn("admission: periodic reload failed; keeping the configuration in force", "err", err)
			}
		}
	}
}

// Stop ends the subscription and the periodic reload and waits for them.
func (w *Watcher) Stop() {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	if w.stop != nil {
		w.stop()
		<-w.done
	}
}

// Reload reads shard 0 and puts its configuration and the tenants'
// priority ceilings in force.
func (w *Watcher) Reload(ctx context.Context) error {
	w.reloadMu.Lock()
	defer w.reloadMu.Unlock()
	cur, err := LoadConfig(ctx, w.o.Shard0)
	if err != nil {
		return err
	}
	ceilings, err := LoadCeilings(ctx, w.o.Shard0)
	if err != nil {
		return err
	}
	w.ceilings.Store(&ceilings)
	w.Apply(cur)
	return nil
}

// Ceilings are the tenants' priority ceilings in force.
func (w *Watcher) Ceilings() Ceilings { return *w.ceilings.Load() }

// Apply puts c in force unless the one in force is newer (a slow reload
// never undoes a later change). The gateway that made a change applies it
// at once with this; the others learn of it through Reload.
func (w *Watcher) Apply(c Current) bool {
	w.mu.Lock()
	old := w.cur.Load()
	if c.UpdatedAt.Before(old.UpdatedAt) {
		w.mu.Unlock()
		return false
	}
	w.cur.Store(&c)
	w.mu.Unlock()
	if w.o.OnChange != nil && (c.Config != old.Config || !c.UpdatedAt.Equal(old.UpdatedAt)) {
		w.o.OnChange(c)
	}
	return true
}

// Current is the configuration in force with its stamp.
func (w *Watcher) Current() Current { return *w.cur.Load() }

// Config is the configuration in force (for AdmitterOptions.Config).
func (w *Watcher) Config() Config { return w.cur.Load().Config }
