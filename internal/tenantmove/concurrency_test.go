package tenantmove

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// executions records what the workers and cancellers did, by run id.
type executions struct {
	mu        sync.Mutex
	completed map[string]int
	cancelled map[string]bool
}

func (x *executions) complete(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.completed[id]++
}

func (x *executions) cancel(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.cancelled[id] = true
}

// Claim loops on both shards (one, the stock worker's four, and sixteen
// per shard), cancels, and starts of the moving tenant and of another
// tenant committing all the while race a move with small batches: no run
// is lost, doubled or run twice, a run whose cancel succeeded is never
// completed, and a start of the moving tenant refused by the fenced old
// home lands on the new one. Not parallel: goleak looks at every
// goroutine of the process, and top-level parallel tests only start once
// this one is over.
func TestMoveUnderClaimsAndCancels(t *testing.T) {
	for _, claimers := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("%d claimers per shard", claimers), func(t *testing.T) {
			moveUnderLoad(t, claimers)
		})
	}
}

func moveUnderLoad(t *testing.T, claimers int) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setup(t)
	const src, dst = 0, 1
	b.home(t, "acme", src)
	var ids []string
	for i := range 40 {
		kind := queued
		if i%10 == 9 {
			kind = scheduled
		}
		ids = append(ids, b.makeRun(t, src, "acme", fmt.Sprintf("r%02d", i), kind).id)
	}
	x := &executions{completed: map[string]int{}, cancelled: map[string]bool{}}
	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	var wg sync.WaitGroup
	for s := range 2 {
		for w := range claimers {
			wg.Go(func() { b.work(ctx, s, fmt.Sprintf("w%d-%d", s, w), x) })
		}
	}
	// Starts commit meanwhile: the moving tenant's go to the old home
	// until its fence refuses them, then to the new one, as a gateway's
	// would; another tenant keeps starting on the old home.
	var startMu sync.Mutex
	var started []string
	others := 0
	startsDone := make(chan struct{})
	go func() {
		defer close(startsDone)
		home := src
		for i := 0; ctx.Err() == nil && i < 200; i++ {
			id := fmt.Sprintf("s%03d", i)
			p := runstore.StartParams{Tenant: "acme", Shard: home, Req: api.StartRequest{ID: id, Name: "echo", Queue: "q"}}
			_, err := runstore.Start(ctx, b.dbs[home], p)
			if m := runstore.AsMoved(err); m != nil {
				home, p.Shard = m.To, m.To
				_, err = runstore.Start(ctx, b.dbs[home], p)
			}
			if err == nil {
				startMu.Lock()
				started = append(started, id)
				startMu.Unlock()
			} else if ctx.Err() == nil {
				t.Errorf("start %s on shard %d: %v", id, home, err)
			}
			o := runstore.StartParams{Tenant: "globex", Shard: src, Req: api.StartRequest{ID: id, Name: "echo", Queue: "q"}}
			if _, err := runstore.Start(ctx, b.dbs[src], o); err == nil {
				others++
			} else if ctx.Err() == nil {
				t.Errorf("start globex %s: %v", id, err)
			}
		}
	}()
	wg.Go(func() {
		for i := 0; i < len(ids); i += 4 {
			if b.cancelAnywhere(ctx, t, "acme", ids[i], src, dst) {
				x.cancel(ids[i])
			}
		}
	})

	o := b.o
	o.Batch = 4
	_, err := Move(b.ctx, o, "acme", dst)
	require.NoError(t, err)
	<-startsDone
	ids = append(ids, started...)
	require.NotEmpty(t, started)
	// Every due run ends; the scheduled ones wait, claimable later.
	require.Eventually(t, func() bool {
		return b.count(t, dst, `SELECT count(*) FROM runs WHERE tenant = 'acme' AND finished_at IS NULL`) ==
			b.count(t, dst, `SELECT count(*) FROM tasks WHERE state = 'scheduled'`)
	}, 30*time.Second, 10*time.Millisecond)
	stop()
	wg.Wait()

	b.invariants(t, "acme", ids, dst)
	require.Len(t, b.runsOf(t, src, "globex"), others, "the other tenant's runs stay on the old home")
	for id, n := range x.completed {
		require.LessOrEqual(t, n, 1, "run %s completed %d times", id, n)
	}
	got := b.runsOf(t, dst, "acme")
	for _, id := range ids {
		require.LessOrEqual(t, x.completed[id], 1, id)
		if x.cancelled[id] {
			require.Zero(t, x.completed[id], id)
			require.Equal(t, "cancelled", got[id].Status, id)
		}
		if x.completed[id] == 1 {
			require.Equal(t, "completed", got[id].Status, id)
		}
	}
	require.Zero(t, b.count(t, dst, `
		SELECT count(*) FROM runs r WHERE tenant = 'acme' AND finished_at IS NULL
		AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_pk = r.pk AND t.state IN ('pending', 'scheduled'))`),
		"an unfinished run without a claimable task")
}

// work claims and completes tasks of queue q on shard s until ctx ends.
func (b *bundle) work(ctx context.Context, s int, worker string, x *executions) {
	db := b.dbs[s]
	for ctx.Err() == nil {
		res, err := claim.Claim(ctx, db, claim.Request{Queue: "q", Worker: worker, Fair: true})
		if err != nil || !res.OK {
			_ = sleep(ctx, time.Millisecond)
			continue
		}
		var tenant, id string
		if err := db.QueryRow(ctx, `SELECT tenant, id FROM runs WHERE pk = $1`, res.Task.RunPK).Scan(&tenant, &id); err != nil {
			continue
		}
		if tenant != "acme" {
			// Another tenant's run: recorded apart, under its tenant.
			id = tenant + "/" + id
		}
		if err := claim.Complete(ctx, db, res.Task.ID, res.Task.LeaseToken, nil); err == nil {
			x.complete(id)
		}
	}
}

// cancelAnywhere cancels the run where it is: the new home first, then
// the old, again while a move holds it. It reports whether this call
// cancelled it.
func (b *bundle) cancelAnywhere(ctx context.Context, t *testing.T, tenant, id string, shardsToTry ...int) bool {
	for ctx.Err() == nil {
		for i := len(shardsToTry) - 1; i >= 0; i-- {
			s := shardsToTry[i]
			res, err := runstore.Cancel(ctx, b.dbs[s], tenant, id, s, "test")
			switch {
			case err == nil:
				return res.Cancelled
			case errors.Is(err, runstore.ErrFinished):
				return false
			case errors.Is(err, runstore.ErrNotFound), errors.Is(err, runstore.ErrRunMoving):
				continue
			case ctx.Err() != nil:
				return false
			default:
				t.Errorf("cancel %s on shard %d: %v", id, s, err)
				return false
			}
		}
		_ = sleep(ctx, time.Millisecond)
	}
	return false
}
