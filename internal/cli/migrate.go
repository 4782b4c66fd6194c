package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sourcegraph/conc/iter"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/schema"
)

// shardResult is one shard's outcome of an operation over every shard.
type shardResult struct {
	Shard   int
	URL     string
	Version int
	Err     error
}

func runMigrate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "migrate", "migrate [-timeout 60s]")
	// A fleet that boots together starts this before its databases take
	// connections: each shard is retried until the timeout.
	timeout := fs.Duration("timeout", 60*time.Second, "how long to keep trying each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var cfg config.Common
	if err := config.Load(&cfg); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usageError{Msg: err.Error()}
	}
	results := migrateShards(ctx, cfg.Shards, *timeout, e.stderr)
	var failed []string
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(e.stdout, "shard %d (%s): FAILED: %v\n", r.Shard, config.Redact(r.URL), r.Err)
			failed = append(failed, fmt.Sprintf("shard %d (%s)", r.Shard, config.Redact(r.URL)))
			continue
		}
		fmt.Fprintf(e.stdout, "shard %d (%s): version %d\n", r.Shard, config.Redact(r.URL), r.Version)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards not migrated: %s", len(failed), len(results), strings.Join(failed, ", "))
	}
	return nil
}

// MigrateShards migrates every shard concurrently. A shard that fails does
// not stop the others; each result says how its shard fared.
func MigrateShards(ctx context.Context, shards []string, timeout time.Duration) []shardResult {
	return migrateShards(ctx, shards, timeout, io.Discard)
}

// migrateShards is MigrateShards that retries each shard until its timeout,
// telling log about every failed attempt.
func migrateShards(ctx context.Context, shards []string, timeout time.Duration, log io.Writer) []shardResult {
	idx := make([]int, len(shards))
	for i := range idx {
		idx[i] = i
	}
	return iter.Map(idx, func(i *int) shardResult {
		r := migrateRetry(ctx, *i, shards[*i], timeout, log)
		r.Shard = *i
		return r
	})
}

// migrateRetry migrates one shard, trying again with backoff (up to 2s
// apart) until timeout runs out or ctx ends.
func migrateRetry(ctx context.Context, shard int, url string, timeout time.Duration, log io.Writer) shardResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		r := migrateOne(ctx, url)
		if r.Err == nil || ctx.Err() != nil {
			return r
		}
		fmt.Fprintf(log, "shard %d (%s): attempt %d: %v (retrying in %s)\n", shard, config.Redact(url), attempt, r.Err, wait)
		select {
		case <-ctx.Done():
			return r
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func migrateOne(ctx context.Context, url string) shardResult {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return shardResult{URL: url, Err: fmt.Errorf("connect: %w", err)}
	}
	defer conn.Close(context.Background())
	v, err := schema.Migrate(ctx, conn)
	return shardResult{URL: url, Version: v, Err: err}
}
