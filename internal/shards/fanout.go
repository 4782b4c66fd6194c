package shards

import (
	"context"
	"sync"
	"time"
)

// Answer is one shard's part of a fan-out, the one shape a per-shard
// answer has in process (the gateway's, the console's, the CLI's, and
// pkg/weights' and pkg/tenantcap's). Its wire form, for a write, is
// api.ShardOutcome.
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

// Unavailable lists the shards whose answer is an error, in the order of
// answers: the unavailable_shards of every answer that reads or writes
// several shards (the API's bodies, the console's pages, the CLI's
// output). It is never nil, so that it encodes as [] in JSON.
func Unavailable[T any](answers []Answer[T]) []int {
	out := []int{}
	for _, a := range answers {
		if a.Err != nil {
			out = append(out, a.Shard)
		}
	}
	return out
}

// Answered returns the answers that are not errors, in order.
func Answered[T any](answers []Answer[T]) []Answer[T] {
	var out []Answer[T]
	for _, a := range answers {
		if a.Err == nil {
			out = append(out, a)
		}
	}
	return out
}
