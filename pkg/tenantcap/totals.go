package tenantcap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/shard"
)

// ShardTotal is the last figure read from one shard.
type ShardTotal struct {
	// Running is the shard's unfinished runs over all tenants.
	Running int
	// ReadAt is when the statement that read Running started (local
	// clock); zero before the first successful read.
	ReadAt time.Time
	// Err is the error of the latest attempt, nil when it succeeded. A
	// failed read keeps the previous Running and ReadAt.
	Err error
}

// Totals caches every shard's count of unfinished runs for the admission
// check, which adds its own shard's exact figure to the cached figures of
// the others. Run refreshes it every interval; a figure in use is at most
// interval plus one read old while its shard answers (see
// docs/admission.md). It is safe for concurrent use.
type Totals struct {
	dbs      []shard.Querier
	interval time.Duration
	timeout  time.Duration

	mu   sync.RWMutex
	snap []ShardTotal
	// refreshMu keeps refreshes one at a time, so an older read never
	// overwrites a newer one.
	refreshMu sync.Mutex
}

// NewTotals caches the totals of dbs, the shards in shard order. interval
// is the refresh period of Run (DefaultRefresh when zero or negative).
func NewTotals(dbs []shard.Querier, interval time.Duration) *Totals {
	if interval <= 0 {
		interval = DefaultRefresh
	}
	return &Totals{
		dbs:      dbs,
		interval: interval,
		// A read may take up to a few intervals before it counts as
		// failed; the old figure stays in use meanwhile.
		timeout: max(4*interval, time.Second),
		snap:    make([]ShardTotal, len(dbs)),
	}
}

// Shards is the number of shards the cache covers.
func (c *Totals) Shards() int { return len(c.dbs) }

// Interval is the refresh period of Run.
func (c *Totals) Interval() time.Duration { return c.interval }

// Refresh reads every shard once, concurrently. Shards that fail keep their
// previous figure; the error joins their failures.
func (c *Totals) Refresh(ctx context.Context) error {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	out := shards.Each(ctx, c.dbs, nil, c.timeout, func(ctx context.Context, _ int, db shard.Querier) (ShardTotal, error) {
		at := time.Now()
		var n int64
		err := db.QueryRow(ctx, sqlShardTotal).Scan(&n)
		return ShardTotal{Running: int(n), ReadAt: at}, err
	})
	var errs []error
	c.mu.Lock()
	for i, r := range out {
		if r.Err != nil {
			c.snap[i].Err = r.Err
			errs = append(errs, fmt.Errorf("shard %d: %w", i, r.Err))
			continue
		}
		c.snap[i] = r.Value
	}
	c.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("tenantcap: refresh totals: %w", errors.Join(errs...))
	}
	return nil
}

// Run refreshes the cache right away and then every interval until ctx
// ends. onError, when set, sees each failed refresh (for logs).
func (c *Totals) Run(ctx context.Context, onError func(error)) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Snapshot returns a copy of every shard's last figure.
func (c *Totals) Snapshot() []ShardTotal {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]ShardTotal, len(c.snap))
	copy(out, c.snap)
	return out
}

// Others sums the cached figures of every shard but except; oldest is the
// earliest ReadAt among them (zero when one was never read).
func (c *Totals) Others(except int) (sum int, oldest time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	first := true
	for i, s := range c.snap {
		if i == except {
			continue
		}
		sum += s.Running
		if first || s.ReadAt.Before(oldest) {
			oldest, first = s.ReadAt, false
		}
	}
	return sum, oldest
}

// Sum is the cached total over every shard.
func (c *Totals) Sum() int {
	n, _ := c.Others(-1)
	return n
}
