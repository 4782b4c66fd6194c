package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/migrate"
)

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
	set, err := openShardSet(ctx, cfg.Shards, 1)
	if err != nil {
		return err
	}
	defer set.Close()
	results := migrateShards(ctx, set, *timeout, e.stderr)
	var failed []string
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(e.stdout, "shard %d (%s): FAILED: %v\n", r.Shard, set.URL(r.Shard), r.Err)
			failed = append(failed, fmt.Sprintf("shard %d (%s)", r.Shard, set.URL(r.Shard)))
			continue
		}
		fmt.Fprintf(e.stdout, "shard %d (%s): version %d\n", r.Shard, set.URL(r.Shard), r.Value)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards not migrated: %s", len(failed), len(results), strings.Join(failed, ", "))
	}
	return nil
}

// migrateShards migrates every shard of set at once, each retried until
// timeout (migrateRetry), telling log about every failed attempt. A shard
// that fails does not stop the others; each answer's value is the shard's
// version afterwards.
func migrateShards(ctx context.Context, set *shardSet, timeout time.Duration, log io.Writer) []shards.Answer[int] {
	return eachShard(ctx, set, 0, func(ctx context.Context, shard int, db *pgxpool.Pool) (int, error) {
		return migrateRetry(ctx, set, shard, db, timeout, log)
	})
}

// migrateRetry migrates one shard, trying again with backoff (up to 2s
// apart) until timeout runs out or ctx ends.
func migrateRetry(ctx context.Context, set *shardSet, shard int, db *pgxpool.Pool, timeout time.Duration, log io.Writer) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := schema.Migrate(ctx, db)
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		fmt.Fprintf(log, "shard %d (%s): attempt %d: %v (retrying in %s)\n", shard, set.URL(shard), attempt, err, wait)
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
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
	set, err := openShardSet(ctx, cfg.Shards, 1)
	if err != nil {
		return err
	}
	defer set.Close()
	answers := eachShard(ctx, set, *timeout, func(ctx context.Context, _ int, db *pgxpool.Pool) ([]migrate.Migration, error) {
		return migrate.Status(ctx, db)
	})
	statuses := make([]shardStatus, len(answers))
	for i, a := range answers {
		st := shardStatus{Shard: a.Shard, URL: set.URL(a.Shard), Migrations: a.Value, Error: errText(a.Err)}
		for _, m := range a.Value {
			if !m.Applied {
				st.Pending++
			}
		}
		statuses[i] = st
	}
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
