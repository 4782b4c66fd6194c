package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sourcegraph/conc/iter"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/pgpool"
)

// shardOutcome is what a command got from one shard.
type shardOutcome[T any] struct {
	Shard int
	Value T
	Error string
}

// eachShard connects to every shard of HARVEST_SHARDS at once, runs f on
// each with its own timeout, and returns the outcomes in shard order. It
// fails only when the configuration is wrong; a shard that fails is an
// outcome with its error.
func eachShard[T any](ctx context.Context, timeout time.Duration,
	f func(ctx context.Context, conn *pgx.Conn) (T, error)) ([]shardOutcome[T], error) {
	var cfg config.Common
	if err := config.Load(&cfg); err != nil {
		return nil, err
	}
	if err := cfg.Shards.Validate(); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	idx := make([]int, len(cfg.Shards))
	for i := range idx {
		idx[i] = i
	}
	return iter.Map(idx, func(i *int) shardOutcome[T] {
		out := shardOutcome[T]{Shard: *i}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		url := cfg.Shards[*i]
		conn, err := pgpool.Connect(ctx, url)
		if err != nil {
			out.Error = fmt.Sprintf("connect %s: %v", config.Redact(url), err)
			return out
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if out.Value, err = f(ctx, conn); err != nil {
			out.Error = err.Error()
		}
		return out
	}), nil
}

// failedShards is the command's error when some shard failed.
func failedShards[T any](results []shardOutcome[T]) error {
	var failed []string
	for _, r := range results {
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("shard %d", r.Shard))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards failed: %s", len(failed), len(results), strings.Join(failed, ", "))
	}
	return nil
}
