package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// The guarantees hold with the worker's defaults and beyond: two workers
// on one shard, claiming in batches into 100 slots (the default), or with 4
// or 16 single-claim loops. Weight 4 against weight 1 over co-due runs of
// both keys gives four claims to one while both have work, and a
// priority-10 flood is claimed before a priority-0 one, but for claims in
// flight together: one batch statement per worker, or one claim per loop.
func TestDefaultWorkersKeepWeightsAndPriority(t *testing.T) {
	t.Parallel()
	def := worker.DefaultConfig()
	for _, m := range []struct {
		name         string
		slots, batch int
		inFlight     int // claim statements of one worker in flight together
	}{
		{fmt.Sprintf("defaults (%d slots, batches of %d)", def.MaxConcurrentClaims, def.ClaimBatch),
			def.MaxConcurrentClaims, def.ClaimBatch, def.BatchClaimers},
		{"4 claim loops", 4, 1, 4},
		{"16 claim loops", 16, 1, 16},
	} {
		t.Run("weights, 2 workers, "+m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := weights.SetOne(b.ctx, b.db, "test", "q", "a", 4)
			require.NoError(t, err)
			for range 500 {
				b.start(startOpts{Key: "a"})
				b.start(startOpts{Key: "b"})
			}
			b.drain(t, m.slots, m.batch, 1000)
			order := b.claimOrder(t)
			end := min(lastOf(order, "a"), lastOf(order, "b"))
			na, nb := countOf(order[:end], "a"), countOf(order[:end], "b")
			t.Logf("while both had work: a %d, b %d (ratio %.2f)", na, nb, float64(na)/float64(nb))
			require.InDelta(t, 4, float64(na)/float64(nb), 0.4)
		})
		t.Run("priority, 2 workers, "+m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for range 300 {
				b.start(startOpts{Key: "lo"})
			}
			for range 300 {
				b.start(startOpts{Key: "hi", Priority: 10})
			}
			b.drain(t, m.slots, m.batch, 600)
			order := b.claimOrder(t)
			// Claims in flight together may overlap: at most those of both
			// workers less one.
			lastHi := lastOf(order, "hi")
			early := countOf(order[:lastHi], "lo")
			t.Logf("priority-0 claims before the last priority-10 one: %d", early)
			require.LessOrEqual(t, early, 2*m.inFlight-1)
		})
	}
}

// drain runs two workers with the default configuration but for the given
// slots and claim batch, fairness on, until n tasks finished.
func (b *bundle) drain(t *testing.T, slots, batch, n int) {
	t.Helper()
	var ws []*running
	for i := range 2 {
		ws = append(ws, b.worker(workerOpts{Config: func(c *worker.Config) {
			*c = worker.DefaultConfig()
			c.Queues = map[string]float64{"q": 1}
			c.FairnessKeys = true
			c.MaxConcurrentClaims = slots
			c.ClaimBatch = batch
			c.RunJanitor = false
			c.ID = fmt.Sprintf("w%d", i)
		}}))
	}
	b.wake("q")
	for done := 0; done < n; {
		select {
		case <-ws[0].Finished:
		case <-ws[1].Finished:
		case <-b.ctx.Done():
			t.Fatalf("%d of %d tasks finished", done, n)
		}
		done++
	}
}

// claimOrder lists the keys of the claimed tasks in the order of their
// claims, by the database clock.
func (b *bundle) claimOrder(t *testing.T) []string {
	t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT fairness_key FROM tasks WHERE claimed_at IS NOT NULL ORDER BY claimed_at, id`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

func lastOf(keys []string, k string) int {
	last := -1
	for i, x := range keys {
		if x == k {
			last = i
		}
	}
	return last
}

func countOf(keys []string, k string) int {
	n := 0
	for _, x := range keys {
		if x == k {
			n++
		}
	}
	return n
}
