package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
		return usageError{Msg: "--window: must not be negative"}
	}
	set, err := openEveryShard(ctx, 1)
	if err != nil {
		return err
	}
	defer set.Close()
	results := eachShard(ctx, set, *timeout, func(ctx context.Context, _ int, db *pgxpool.Pool) ([]claim.StateKey, error) {
		// The database clock decides what is inside the window.
		return claim.PruneFairState(ctx, db, time.Time{}, *window, *preview)
	})
	enc := json.NewEncoder(e.stdout)
	for _, r := range results {
		out := pruneResult{Shard: r.Shard, Preview: *preview, Deleted: r.Value, Error: errText(set.named(r.Shard, r.Err))}
		if out.Deleted == nil {
			out.Deleted = []claim.StateKey{}
		}
		if *asJSON {
			if err := enc.Encode(out); err != nil {
				return err
			}
			continue
		}
		verb := "deleted"
		if out.Preview {
			verb = "would delete"
		}
		if r.Err != nil {
			fmt.Fprintf(e.stdout, "shard %d: FAILED: %s\n", r.Shard, out.Error)
			continue
		}
		fmt.Fprintf(e.stdout, "shard %d: %s %d fairness state rows\n", r.Shard, verb, len(out.Deleted))
		for _, k := range out.Deleted {
			fmt.Fprintf(e.stdout, "  queue %q key %q\n", k.Queue, k.Key)
		}
	}
	return failedShards(results)
}
