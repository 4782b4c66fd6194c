package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/claim"
)

// repairResult is one shard's outcome of a repair.
type repairResult struct {
	Shard  int              `json:"shard"`
	Queues []claim.Repaired `json:"queues"`
	Error  string           `json:"error,omitempty"`
}

// runRepair rebuilds the fair claim's key heads from the task rows on every
// shard, while claims go on. The janitor does the same once per
// HARVEST_FAIR_REPAIR_INTERVAL; the command is for right after something
// wrote tasks past the triggers (a bulk load with them disabled).
func runRepair(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "repair", "repair [--queue Q]... [--json] [--timeout 30s]")
	var queues []string
	fs.Func("queue", "repair this queue only (repeatable; default: every queue with pending work or fairness state)",
		func(q string) error {
			if q == "" {
				return fmt.Errorf("empty queue name")
			}
			queues = append(queues, q)
			return nil
		})
	asJSON := fs.Bool("json", false, "print one JSON object per shard")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set, err := openEveryShard(ctx, 1)
	if err != nil {
		return err
	}
	defer set.Close()
	results := eachShard(ctx, set, *timeout, func(ctx context.Context, _ int, db *pgxpool.Pool) ([]claim.Repaired, error) {
		return claim.Repair(ctx, db, queues...)
	})
	enc := json.NewEncoder(e.stdout)
	for _, r := range results {
		out := repairResult{Shard: r.Shard, Queues: r.Value, Error: errText(set.named(r.Shard, r.Err))}
		if out.Queues == nil {
			out.Queues = []claim.Repaired{}
		}
		if *asJSON {
			if err := enc.Encode(out); err != nil {
				return err
			}
			continue
		}
		if r.Err != nil {
			fmt.Fprintf(e.stdout, "shard %d: FAILED: %s\n", r.Shard, out.Error)
			continue
		}
		repaired, refreshed := 0, 0
		for _, q := range r.Value {
			repaired += q.Repaired
			refreshed += q.Refreshed
		}
		fmt.Fprintf(e.stdout, "shard %d: %d queues, %d key heads repaired, %d refreshed\n",
			r.Shard, len(r.Value), repaired, refreshed)
		for _, q := range r.Value {
			if q.Repaired+q.Refreshed > 0 {
				fmt.Fprintf(e.stdout, "  queue %q: %d repaired, %d refreshed\n", q.Queue, q.Repaired, q.Refreshed)
			}
		}
	}
	return failedShards(results)
}
