package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/pkg/weights"
)

// shardSet is a small pool on every shard of HARVEST_SHARDS, for commands
// that fan out. Opening it connects to nothing: a shard that is down shows
// up as an unavailable outcome of the first statement sent to it.
type shardSet struct {
	pools []*pgxpool.Pool
}

// defaultConnectTimeout applies to shard URLs that set no connect_timeout,
// so a shard that does not answer costs seconds, not minutes.
const defaultConnectTimeout = 5 * time.Second

func openShardSet(ctx context.Context, urls config.Shards) (*shardSet, error) {
	s := &shardSet{}
	for i, u := range urls {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			s.Close()
			return nil, usageError{Msg: fmt.Sprintf("HARVEST_SHARDS: shard %d: %q: %v", i, config.Redact(u), err)}
		}
		if cfg.ConnConfig.ConnectTimeout == 0 {
			cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
		}
		cfg.MaxConns = 2
		p, err := pgpool.New(ctx, i, cfg)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("shard %d (%s): %w", i, config.Redact(u), err)
		}
		s.pools = append(s.pools, p)
	}
	return s, nil
}

// Shards returns the set in the form pkg/weights fans out over.
func (s *shardSet) Shards() []weights.Shard {
	out := make([]weights.Shard, len(s.pools))
	for i, p := range s.pools {
		out[i] = weights.Shard{Index: i, DB: p}
	}
	return out
}

// Close closes every pool.
func (s *shardSet) Close() {
	for _, p := range s.pools {
		p.Close()
	}
}
