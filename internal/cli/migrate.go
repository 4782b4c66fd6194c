package cli

import (
	"context"
	"fmt"
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
	fs := newFlags(e, "migrate", "migrate [-timeout 30s]")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for each shard")
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
	results := MigrateShards(ctx, cfg.Shards, *timeout)
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
	idx := make([]int, len(shards))
	for i := range idx {
		idx[i] = i
	}
	return iter.Map(idx, func(i *int) shardResult {
		r := migrateOne(ctx, shards[*i], timeout)
		r.Shard = *i
		return r
	})
}

func migrateOne(ctx context.Context, url string, timeout time.Duration) shardResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return shardResult{URL: url, Err: fmt.Errorf("connect: %w", err)}
	}
	defer conn.Close(context.Background())
	v, err := schema.Migrate(ctx, conn)
	return shardResult{URL: url, Version: v, Err: err}
}
