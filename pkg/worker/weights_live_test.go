package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/weights"
	"github.com/harvest-run/harvest/pkg/worker"
)

// A running worker applies a weight change at its very next claim, with no
// restart: the handler of the 20th task gives key "a" weight 3 before it
// returns, and from the 21st claim on the claims of a flood on both keys
// follow 3:1. One claim loop makes the claim order the handler order.
func TestWeightChangeReachesRunningWorkerAtNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const before, after = 20, 40
	var (
		mu    sync.Mutex
		order []string
	)
	done := make(chan struct{})
	record := func(ctx context.Context, tk worker.Task) (worker.Result, error) {
		mu.Lock()
		order = append(order, tk.Key)
		n := len(order)
		mu.Unlock()
		if n == before {
			if _, err := weights.SetOne(ctx, b.db, "test", "q", "a", 3); err != nil {
				return worker.Result{}, err
			}
		}
		if n == before+after {
			close(done)
		}
		return worker.Complete(nil), nil
	}
	for range 60 {
		b.start(startOpts{Name: "rec", Key: "a"})
		b.start(startOpts{Name: "rec", Key: "b"})
	}
	b.worker(workerOpts{
		Config: func(c *worker.Config) {
			c.FairnessKeys = true
			c.PollInterval = 20 * time.Millisecond
		},
		Handlers: map[string]worker.HandlerFunc{"rec": record},
	})
	b.wake("q")
	select {
	case <-done:
	case <-b.ctx.Done():
		t.Fatal("the worker did not take 60 claims")
	}

	mu.Lock()
	defer mu.Unlock()
	count := func(keys []string) (a int) {
		for _, k := range keys {
			if k == "a" {
				a++
			}
		}
		return a
	}
	// Equal weights: the keys alternate. Weight 3 against 1: within SFQ's
	// bound of 1/3 + 1 claims-per-weight, "a" takes 29 to 31 of 40.
	require.InDelta(t, before/2, count(order[:before]), 1, "before the change: %v", order[:before])
	require.InDelta(t, 30, count(order[before:before+after]), 1, "after the change: %v", order[before:before+after])
}
