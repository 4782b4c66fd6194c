package runstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/api"
)

func item(tenant string, n int) *pending {
	return &pending{p: StartParams{Tenant: tenant, Req: api.StartRequest{ID: fmt.Sprint(n)}}}
}

// tryTake is take without waiting: what a flusher would get right now.
func (q *intake) tryTake(max int) []*pending {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stepLocked(nil, max)
}

// A group that committed gives up its tenants before it is answered: the
// next group of the tenant may go while it waits for its flush, and its
// release later does not free the tenant that group holds.
func TestIntakeUnholdLetsTheNextGroupIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newIntake(16, 4)
	_, err := q.push(ctx, item("a", 1))
	require.NoError(t, err)
	first := q.tryTake(8)
	require.Len(t, first, 1)
	_, err = q.push(ctx, item("a", 2))
	require.NoError(t, err)
	require.Empty(t, q.tryTake(8), "a is held by the group in flight")
	q.unhold(first)
	second := q.tryTake(8)
	require.Len(t, second, 1, "once the first group committed, the next one goes")
	_, err = q.push(ctx, item("a", 3))
	require.NoError(t, err)
	q.release(first)
	require.Empty(t, q.tryTake(8), "the first group's release leaves a to the second group")
	q.release(second)
	require.Len(t, q.tryTake(8), 1)
}

func TestIntakeKeepsTenantInOneGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newIntake(16, 1)
	for i, tenant := range []string{"a", "a", "b"} {
		_, err := q.push(ctx, item(tenant, i))
		require.NoError(t, err)
	}
	first := q.take(10, 0)
	require.Len(t, first, 3)

	_, _ = q.push(ctx, item("a", 3))
	_, _ = q.push(ctx, item("c", 4))
	_, _ = q.push(ctx, item("b", 5))
	second := q.tryTake(10)
	require.Len(t, second, 1, "only c is free while a and b are in flight")
	require.Equal(t, "c", second[0].p.Tenant)

	q.release(first)
	third := q.take(10, 0)
	require.Len(t, third, 2)
	require.Equal(t, []string{"a", "b"}, []string{third[0].p.Tenant, third[1].p.Tenant})
}

func TestIntakeOverlapsOnlyWithABacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newIntake(16, 3)
	_, _ = q.push(ctx, item("a", 0))
	first := q.take(10, 0)
	require.Len(t, first, 1, "nothing in flight: a group of one goes at once")

	_, _ = q.push(ctx, item("b", 1))
	_, _ = q.push(ctx, item("a", 2))
	_, _ = q.push(ctx, item("c", 3))
	require.Empty(t, q.tryTake(10), "two free starts do not make a second group while one is in flight")
	_, _ = q.push(ctx, item("d", 4))
	second := q.tryTake(10)
	require.Len(t, second, 3, "three do")
	require.Len(t, q.items, 1, "a's start waits for a's group")

	q.release(first)
	q.release(second)
	require.Len(t, q.tryTake(10), 1, "with nothing in flight any start goes")
}

func TestIntakeTakeWaitsForRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newIntake(4, 1)
	_, _ = q.push(ctx, item("a", 0))
	first := q.take(1, 0)
	_, _ = q.push(ctx, item("a", 1))

	got := make(chan []*pending)
	go func() { got <- q.take(4, 0) }()
	q.release(first)
	second := <-got
	require.Len(t, second, 1)
	require.Equal(t, first[0].p.Tenant, second[0].p.Tenant)
}

func TestIntakeClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newIntake(4, 1)
	_, _ = q.push(ctx, item("a", 0))
	q.close()
	closed, err := q.push(ctx, item("a", 1))
	require.NoError(t, err)
	require.True(t, closed, "a push after close is refused")
	require.Len(t, q.take(4, time.Hour), 1, "what was queued before close is still taken, without lingering")
	require.Nil(t, q.take(4, 0), "closed and empty")
}

func TestIntakePushWaitsForRoom(t *testing.T) {
	t.Parallel()
	q := newIntake(1, 1)
	_, _ = q.push(context.Background(), item("a", 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := q.push(ctx, item("b", 1))
	require.ErrorIs(t, err, context.Canceled, "the queue is full")
	q.take(1, 0)
	_, err = q.push(context.Background(), item("b", 1))
	require.NoError(t, err, "taking made room")
}

// TestIntakeProperties drives pushes, takes and releases of several
// flushers in random order and checks what the committer relies on: no
// tenant is in two groups at once, a tenant's starts leave in the order
// they came, each start leaves once, and a take leaves behind only starts
// it could not have taken.
func TestIntakeProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		ctx := context.Background()
		q := newIntake(1000, 1)
		flushers := rapid.IntRange(1, 3).Draw(t, "flushers")
		max := rapid.IntRange(1, 5).Draw(t, "max")
		groups := make([][]*pending, flushers) // nil: the flusher is free
		var pushed, taken []*pending
		next := 0
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				it := item(rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(t, "tenant"), next)
				next++
				_, err := q.push(ctx, it)
				require.NoError(t, err)
				pushed = append(pushed, it)
			case 1:
				f := rapid.IntRange(0, flushers-1).Draw(t, "taker")
				if groups[f] != nil {
					continue
				}
				got := q.tryTake(max)
				require.LessOrEqual(t, len(got), max)
				for _, it := range got {
					for g, other := range groups {
						for _, o := range other {
							require.NotEqual(t, o.p.Tenant, it.p.Tenant, "tenant %s taken while flusher %d holds it", it.p.Tenant, g)
						}
					}
				}
				if len(got) < max {
					for _, left := range q.items {
						held := false
						for _, other := range groups {
							for _, o := range other {
								held = held || o.p.Tenant == left.p.Tenant
							}
						}
						require.True(t, held, "start of %s left behind while its tenant was free", left.p.Tenant)
					}
				}
				if len(got) > 0 {
					groups[f] = got
					taken = append(taken, got...)
				}
			case 2:
				f := rapid.IntRange(0, flushers-1).Draw(t, "releaser")
				if groups[f] != nil {
					q.release(groups[f])
					groups[f] = nil
				}
			}
		}
		for f := range groups {
			if groups[f] != nil {
				q.release(groups[f])
			}
		}
		q.close()
		for {
			got := q.take(max, 0)
			if got == nil {
				break
			}
			taken = append(taken, got...)
			q.release(got)
		}
		require.ElementsMatch(t, pushed, taken, "every start leaves once")
		order := map[string][]string{}
		for _, it := range pushed {
			order[it.p.Tenant] = append(order[it.p.Tenant], it.p.Req.ID)
		}
		left := map[string][]string{}
		for _, it := range taken {
			left[it.p.Tenant] = append(left[it.p.Tenant], it.p.Req.ID)
		}
		require.Equal(t, order, left, "a tenant's starts leave in the order they came")
	})
}

// TestIntakeConcurrentFlushers runs real flushers against concurrent
// pushers (for the race detector) and checks tenant exclusivity live.
func TestIntakeConcurrentFlushers(t *testing.T) {
	t.Parallel()
	q := newIntake(8, 1)
	var mu sync.Mutex
	holding := map[string]int{}
	var taken [][]*pending
	var flushers sync.WaitGroup
	for f := range 3 {
		flushers.Go(func() {
			for {
				got := q.take(4, 0)
				if got == nil {
					return
				}
				mu.Lock()
				for _, it := range got {
					if h, ok := holding[it.p.Tenant]; ok && h != f {
						t.Errorf("tenant %s in flushers %d and %d", it.p.Tenant, h, f)
					}
					holding[it.p.Tenant] = f
				}
				taken = append(taken, got)
				mu.Unlock()
				runtime.Gosched() // the group is in flight
				mu.Lock()
				for _, it := range got {
					delete(holding, it.p.Tenant)
				}
				mu.Unlock()
				q.release(got)
			}
		})
	}
	var pushers sync.WaitGroup
	for p := range 4 {
		pushers.Go(func() {
			for i := range 200 {
				_, err := q.push(context.Background(), item(fmt.Sprint("t", (p+i)%5), p*1000+i))
				require.NoError(t, err)
			}
		})
	}
	pushers.Wait()
	q.close()
	flushers.Wait()
	n := 0
	for _, g := range taken {
		n += len(g)
	}
	require.Equal(t, 800, n)
}
