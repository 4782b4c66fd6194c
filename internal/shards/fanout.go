package shards

import (
	"context"
	"sync"
	"time"
)

// Answer is one shard's part of a fan-out.
type Answer[T any] struct {
	// Shard is the shard's index, as Each was given it.
	Shard int
	Value T
	Err   error
}

// Each calls fn for every shard of dbs at once, each under its own timeout
// (none when timeout is zero or less), and returns the answers in the order
// of dbs. index gives each element's shard index (nil: its position), so a
// fan-out over some of the shards keeps their numbers. One shard that
// hangs holds only its own answer, up to the timeout.
func Each[D, T any](ctx context.Context, dbs []D, index func(int, D) int, timeout time.Duration,
	fn func(ctx context.Context, shard int, db D) (T, error)) []Answer[T] {
	out := make([]Answer[T], len(dbs))
	var wg sync.WaitGroup
	for i, db := range dbs {
		shard := i
		if index != nil {
			shard = index(i, db)
		}
		wg.Go(func() {
			sctx, cancel := ctx, context.CancelFunc(func() {})
			if timeout > 0 {
				sctx, cancel = context.WithTimeout(ctx, timeout)
			}
			defer cancel()
			v, err := fn(sctx, shard, db)
			out[i] = Answer[T]{Shard: shard, Value: v, Err: err}
		})
	}
	wg.Wait()
	return out
}
