package directory

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/singleflight"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Defaults of Options.
const (
	// DefaultRefresh is how often a Directory re-reads the entries that
	// changed on shard 0: the longest two gateways can disagree about a
	// tenant's home when a change event is lost.
	DefaultRefresh = 5 * time.Second
	// refreshOverlap is how far back each re-read looks past the previous
	// one, so an entry written by a transaction that began before the
	// last read but committed after it is not missed.
	refreshOverlap = time.Minute
)

// Options configure a Directory.
type Options struct {
	// Shard0 holds tenant_homes. Required.
	Shard0 shard.Querier
	// Shards is how many shards the caller has: new tenants are placed
	// among them, and an entry naming a shard beyond them is an error.
	Shards int
	// NATS and Prefix, when NATS is set, deliver change events
	// (dispatch.Subjects.Tenants).
	NATS   *nats.Conn
	Prefix string
	// Refresh is the period of Run's re-reads (DefaultRefresh when zero).
	Refresh time.Duration
	Log     *slog.Logger
}

// Directory caches tenants' entries for a gateway or a tool. Safe for
// concurrent use.
type Directory struct {
	o     Options
	group singleflight.Group

	mu      sync.Mutex
	entries map[string]Entry
	// loaded is when each cached entry was last read from shard 0.
	loaded map[string]time.Time
}

// New returns an empty Directory.
func New(o Options) *Directory {
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Directory{o: o, entries: map[string]Entry{}, loaded: map[string]time.Time{}}
}

// Home returns the tenant's entry: the cached one, else the one on shard
// 0, else a new one placed by rendezvous hashing and recorded. Calls for
// one tenant that miss the cache at once read shard 0 once.
func (d *Directory) Home(ctx context.Context, tenant string) (Entry, error) {
	d.mu.Lock()
	e, ok := d.entries[tenant]
	d.mu.Unlock()
	if ok {
		return e, nil
	}
	return d.load(ctx, tenant, tenant)
}

// load reads (or places) the tenant's entry on shard 0 and keeps it, once
// for all the callers that ask under the same flight name at once.
func (d *Directory) load(ctx context.Context, flight, tenant string) (Entry, error) {
	v, err, _ := d.group.Do(flight, func() (any, error) {
		e, err := Place(ctx, d.o.Shard0, tenant, shards.Home(tenant, max(d.o.Shards, 1)))
		if err != nil {
			return Entry{}, err
		}
		return d.keep(e), nil
	})
	if err != nil {
		return Entry{}, err
	}
	e := v.(Entry)
	return e, d.check(e)
}

// Reload reads the tenant's entry from shard 0 whatever the cache holds
// (placing the tenant when it has none), and keeps it.
func (d *Directory) Reload(ctx context.Context, tenant string) (Entry, error) {
	// A flight of its own: a reload must not take the answer of a read
	// that began before the change it is after.
	return d.load(ctx, "reload\x00"+tenant, tenant)
}

// ReloadStale is Reload unless the tenant's entry was read from shard 0
// less than age ago, in which case it returns the cached entry: for
// callers that re-read on a hint anyone can cause (a run not found), so
// that a flood of them costs shard 0 at most one read per tenant per age.
func (d *Directory) ReloadStale(ctx context.Context, tenant string, age time.Duration) (Entry, error) {
	d.mu.Lock()
	e, ok := d.entries[tenant]
	fresh := ok && time.Since(d.loaded[tenant]) < age
	d.mu.Unlock()
	if fresh {
		return e, d.check(e)
	}
	return d.Reload(ctx, tenant)
}

// Cached returns the cached entry of the tenant, if any.
func (d *Directory) Cached(tenant string) (Entry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries[tenant]
	return e, ok
}

// keep caches e unless a later version is cached, and returns the entry
// the cache then holds.
func (d *Directory) keep(e Entry) Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.loaded[e.Tenant] = time.Now()
	if old, ok := d.entries[e.Tenant]; ok && old.Version > e.Version {
		return old
	}
	d.entries[e.Tenant] = e
	return e
}

// check refuses an entry naming a shard this caller does not have.
func (d *Directory) check(e Entry) error {
	for _, s := range []int{e.Shard, e.From(), e.Target()} {
		if s >= d.o.Shards {
			return fmt.Errorf("directory: tenant %s: its home is shard %d but only %d shards are configured (HARVEST_SHARDS)",
				e.Tenant, s, d.o.Shards)
		}
	}
	return nil
}

// Run keeps the cache current until ctx ends: it re-reads a cached
// tenant's entry when a change event names a version it does not hold,
// and every Refresh reads whatever changed on shard 0 since the last
// time. It returns when ctx ends.
func (d *Directory) Run(ctx context.Context) {
	if d.o.NATS != nil {
		sub, err := d.o.NATS.Subscribe(dispatch.Subjects{Prefix: d.o.Prefix}.Tenants(), func(m *nats.Msg) {
			var ev dispatch.TenantChanged
			if json.Unmarshal(m.Data, &ev) != nil || ev.Tenant == "" {
				return
			}
			if e, ok := d.Cached(ev.Tenant); !ok || e.Version >= ev.Version {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, d.o.Refresh)
			defer cancel()
			if e, err := Get(rctx, d.o.Shard0, ev.Tenant); err == nil {
				d.keep(e)
			}
		})
		if err != nil {
			d.o.Log.Warn("directory: subscribe to tenant changes; relying on the periodic re-read", "err", err)
		} else {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	var since time.Time
	t := time.NewTicker(d.o.Refresh)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, d.o.Refresh)
		changed, at, err := changedSince(rctx, d.o.Shard0, since)
		cancel()
		if err == nil {
			for _, e := range changed {
				if _, ok := d.Cached(e.Tenant); ok {
					d.keep(e)
				}
			}
			since = at.Add(-refreshOverlap)
		} else if ctx.Err() == nil {
			d.o.Log.Warn("directory: re-read changed tenants", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Announce tells every Directory listening on nc that e changed. It is a
// hint (the periodic re-read catches a lost one); a nil nc does nothing.
func Announce(ctx context.Context, nc *nats.Conn, prefix string, e Entry) error {
	if nc == nil {
		return nil
	}
	return dispatch.Publish(ctx, nc, dispatch.Subjects{Prefix: prefix}.Tenants(),
		dispatch.TenantChanged{Tenant: e.Tenant, Version: e.Version})
}
