package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sourcegraph/conc/iter"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/pkg/claim"
)

// pruneResult is one shard's outcome of a prune.
type pruneResult struct {
	Shard   int              `json:"shard"`
	Preview bool             `json:"preview"`
	Deleted []claim.StateKey `json:"deleted"`
	Error   string           `json:"error,omitempty"`
}

func runPrune(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "prune", "prune [--window 1h] [--preview] [--json] [--timeout 30s]")
	window := fs.Duration("window", time.Hour, "keep state charged within this window")
	preview := fs.Bool("preview", false, "report what would be deleted, on a temporary copy, deleting nothing")
	asJSON := fs.Bool("json", false, "print one JSON object per shard")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *window < 0 {
		return usageError{"--window: must not be negative"}
	}
	var cfg config.Common
	if err := config.Load(&cfg); err != nil {
		return err
	}
	if err := cfg.Shards.Validate(); err != nil {
		return usageError{err.Error()}
	}
	idx := make([]int, len(cfg.Shards))
	for i := range idx {
		idx[i] = i
	}
	results := iter.Map(idx, func(i *int) pruneResult {
		r := pruneResult{Shard: *i, Preview: *preview, Deleted: []claim.StateKey{}}
		keys, err := pruneOne(ctx, cfg.Shards[*i], *window, *preview, *timeout)
		if err != nil {
			r.Error = err.Error()
		} else if keys != nil {
			r.Deleted = keys
		}
		return r
	})
	var failed []string
	enc := json.NewEncoder(e.stdout)
	for _, r := range results {
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("shard %d", r.Shard))
		}
		if *asJSON {
			if err := enc.Encode(r); err != nil {
				return err
			}
			continue
		}
		verb := "deleted"
		if r.Preview {
			verb = "would delete"
		}
		if r.Error != "" {
			fmt.Fprintf(e.stdout, "shard %d: FAILED: %s\n", r.Shard, r.Error)
			continue
		}
		fmt.Fprintf(e.stdout, "shard %d: %s %d fairness state rows\n", r.Shard, verb, len(r.Deleted))
		for _, k := range r.Deleted {
			fmt.Fprintf(e.stdout, "  queue %q key %q\n", k.Queue, k.Key)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards failed: %s", len(failed), len(results), strings.Join(failed, ", "))
	}
	return nil
}

func pruneOne(ctx context.Context, url string, window time.Duration, preview bool, timeout time.Duration) ([]claim.StateKey, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", config.Redact(url), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The database clock decides what is inside the window.
	return claim.PruneFairState(ctx, conn, time.Time{}, window, preview)
}
