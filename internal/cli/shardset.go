package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/weights"
)

// shardSet is how every command that talks to the shards themselves
// reaches them: a small pool on each shard of HARVEST_SHARDS, opened by
// internal/pgpool like the binaries' pools (so a shard whose primary
// changed is followed), and eachShard, the one fan-out over them
// (internal/shards.Each, as in the servers). Opening it connects to
// nothing: a shard that is down shows up as the error of its answer to
// the first statement sent to it.
type shardSet struct {
	urls  config.Shards
	pools []*pgxpool.Pool
}

// defaultConnectTimeout applies to shard URLs that set no connect_timeout,
// so a shard that does not answer costs seconds, not minutes.
const defaultConnectTimeout = 5 * time.Second

// openShardSet opens a pool of at most maxConns connections on every
// shard of urls (validated already). A URL that does not parse is a usage
// error naming the shard.
func openShardSet(ctx context.Context, urls config.Shards, maxConns int32) (*shardSet, error) {
	s := &shardSet{urls: urls}
	for i, u := range urls {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			s.Close()
			return nil, usageError{Msg: fmt.Sprintf("HARVEST_SHARDS: shard %d: %q: %v", i, config.Redact(u), err)}
		}
		if cfg.ConnConfig.ConnectTimeout == 0 {
			cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
		}
		cfg.MaxConns = maxConns
		p, err := pgpool.New(ctx, i, pgpool.AppCLI, cfg)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("shard %d (%s): %w", i, config.Redact(u), err)
		}
		s.pools = append(s.pools, p)
	}
	return s, nil
}

// openEveryShard reads HARVEST_SHARDS (a bad list is a usage error) and
// opens the set on it.
func openEveryShard(ctx context.Context, maxConns int32) (*shardSet, error) {
	var cfg config.Common
	if err := config.Load(&cfg); err != nil {
		return nil, err
	}
	if err := cfg.Shards.Validate(); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	return openShardSet(ctx, cfg.Shards, maxConns)
}

// Shards returns the set in the form pkg/weights fans out over.
func (s *shardSet) Shards() []weights.Shard {
	out := make([]weights.Shard, len(s.pools))
	for i, p := range s.pools {
		out[i] = weights.Shard{Index: i, DB: p}
	}
	return out
}

// URL is shard i's URL with its password hidden, for messages.
func (s *shardSet) URL(i int) string { return config.Redact(s.urls[i]) }

// Close closes every pool.
func (s *shardSet) Close() {
	for _, p := range s.pools {
		p.Close()
	}
}

// eachShard runs f on every shard of set at once, each under timeout (none
// when zero: f bounds itself), and returns one answer per shard in shard
// order (internal/shards.Each).
func eachShard[T any](ctx context.Context, set *shardSet, timeout time.Duration,
	f func(ctx context.Context, shard int, db *pgxpool.Pool) (T, error)) []shards.Answer[T] {
	return shards.Each(ctx, set.pools, nil, timeout, f)
}

// named adds shard i's URL to an error of connecting to it (pgx names the
// user and database only), for output that does not name the URL itself.
func (s *shardSet) named(i int, err error) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("connect %s: %w", s.URL(i), err)
	}
	return err
}

// failedShards is the command's error when some shard failed.
func failedShards[T any](answers []shards.Answer[T]) error {
	failed := shards.Unavailable(answers)
	if len(failed) == 0 {
		return nil
	}
	names := make([]string, len(failed))
	for i, n := range failed {
		names[i] = fmt.Sprintf("shard %d", n)
	}
	return fmt.Errorf("%d of %d shards failed: %s", len(failed), len(answers), strings.Join(names, ", "))
}

// errText is an answer's error as the commands print it ("" for none).
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
