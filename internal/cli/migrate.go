package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sourcegraph/conc/iter"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/pkg/migrate"
)

// shardResult is one shard's outcome of an operation over every shard.
type shardResult struct {
	Shard   int
	URL     string
	Version int
	Err     error
}

func runMigrate(ctx context.Context, e env, args []string) error {
	if len(args) > 0 && args[0] == "status" {
		return runMigrateStatus(ctx, e, args[1:])
	}
	fs := newFlags(e, "migrate", "migrate [-timeout 60s] | migrate status [--json]")
	// A fleet that boots together starts this before its databases take
	// connections: each shard is retried until the timeout.
	timeout := fs.Duration("timeout", 60*time.Second, "how long to keep trying each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadCommon()
	if err != nil {
		return err
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
	conn, err := pgpool.Connect(ctx, url)
	if err != nil {
		return shardResult{URL: url, Err: fmt.Errorf("connect: %w", err)}
	}
	defer conn.Close(context.Background())
	v, err := schema.Migrate(ctx, conn)
	return shardResult{URL: url, Version: v, Err: err}
}

// loadCommon reads the settings every binary shares (HARVEST_SHARDS);
// a value that does not validate is a usage error.
func loadCommon() (config.Common, error) {
	var cfg config.Common
	if err := config.Load(&cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{Msg: err.Error()}
	}
	return cfg, nil
}

// shardStatus is one shard's answer to migrate status.
type shardStatus struct {
	Shard      int                 `json:"shard"`
	URL        string              `json:"url"`
	Migrations []migrate.Migration `json:"migrations,omitempty"`
	Pending    int                 `json:"pending"`
	Error      string              `json:"error,omitempty"`
}

// runMigrateStatus lists, for every shard, this release's migrations,
// each applied (with when, by the database's clock) or pending. It
// changes nothing. Pending migrations are not an error (the next
// migrate or a binary's start applies them); a shard that does not answer
// is.
func runMigrateStatus(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "migrate status", "migrate status [--json]")
	asJSON := fs.Bool("json", false, "print the statuses as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadCommon()
	if err != nil {
		return err
	}
	idx := make([]int, len(cfg.Shards))
	for i := range idx {
		idx[i] = i
	}
	statuses := iter.Map(idx, func(i *int) shardStatus {
		st := shardStatus{Shard: *i, URL: config.Redact(cfg.Shards[*i])}
		ms, err := shardMigrations(ctx, *i, cfg.Shards[*i], *timeout)
		if err != nil {
			st.Error = err.Error()
			return st
		}
		st.Migrations = ms
		for _, m := range ms {
			if !m.Applied {
				st.Pending++
			}
		}
		return st
	})
	var failed []string
	for _, st := range statuses {
		if st.Error != "" {
			failed = append(failed, fmt.Sprintf("shard %d (%s)", st.Shard, st.URL))
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(statuses); err != nil {
			return err
		}
	} else {
		for _, st := range statuses {
			if st.Error != "" {
				fmt.Fprintf(e.stdout, "shard %d (%s): FAILED: %s\n", st.Shard, st.URL, st.Error)
				continue
			}
			fmt.Fprintf(e.stdout, "shard %d (%s): %d applied, %d pending\n", st.Shard, st.URL, len(st.Migrations)-st.Pending, st.Pending)
			for _, m := range st.Migrations {
				state := "pending"
				if m.Applied {
					state = "applied " + m.AppliedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(e.stdout, "  %04d %-28s %s\n", m.Version, m.Name, state)
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards did not answer: %s", len(failed), len(statuses), strings.Join(failed, ", "))
	}
	return nil
}

// shardMigrations reads one shard's migration status.
func shardMigrations(ctx context.Context, shard int, url string, timeout time.Duration) ([]migrate.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	pool, err := pgpool.New(ctx, shard, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	return migrate.Status(ctx, pool)
}
