package deferred_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/pkg/api"
)

const firers = 8

// fireConcurrently runs firers Fire calls at once at t0+d and returns the
// runs they started in total.
func (b *bundle) fireConcurrently(d time.Duration) int {
	b.t.Helper()
	g := pool.NewWithResults[int]().WithErrors()
	for range firers {
		g.Go(func() (int, error) {
			rep, err := deferred.Fire(b.ctx, b.db, deferred.FireOptions{Now: at(b, d)})
			return rep.Fired, err
		})
	}
	counts, err := g.Wait()
	require.NoError(b.t, err)
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}

// Many firers racing over many deferred starts make exactly one run for
// each throttled start, each debounce window and each batch.
func TestRacingFirersFireEachGroupOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenants := []string{"acme", "globex", "initech", "umbrella"}
	const perKey = 10
	for _, tn := range tenants {
		for k := range 2 {
			spec := fmt.Sprintf(`{"key": "k%d", "limit": 2, "period": "1m"}`, k)
			for range perKey {
				b.start(startOpts{Tenant: tn, Throttle: spec})
			}
		}
		for k := range 5 {
			for i := range 3 {
				b.start(startOpts{Tenant: tn, Debounce: fmt.Sprintf(`{"key": "d%d", "period": "30s"}`, k), At: time.Duration(i) * time.Second})
				b.start(startOpts{Tenant: tn, Batch: fmt.Sprintf(`{"key": "b%d", "max_size": 100, "max_wait": "1m"}`, k), At: time.Duration(i) * time.Second})
			}
		}
	}
	throttleKeys := len(tenants) * 2
	immediate := throttleKeys * 2
	windows := len(tenants) * 5
	batches := len(tenants) * 5
	runs, _ := b.runs()
	require.Equal(t, immediate, runs)

	// At +1m every window and batch is due, and each throttle key has room
	// for two more.
	require.Equal(t, windows+batches+throttleKeys*2, b.fireConcurrently(time.Minute))
	require.Zero(t, b.fireConcurrently(time.Minute), "nothing fires twice")
	for m := 2; m <= 4; m++ {
		require.Equal(t, throttleKeys*2, b.fireConcurrently(time.Duration(m)*time.Minute), "minute %d", m)
	}
	require.Zero(t, b.fireConcurrently(time.Hour))

	runs, tasks := b.runs()
	want := throttleKeys*perKey + windows + batches
	require.Equal(t, want, runs)
	require.Equal(t, want, tasks, "one first task per run")
	require.Zero(t, b.scalar(`SELECT count(*) FROM deferred_groups WHERE state <> 'fired'`))
	require.Zero(t, b.scalar(`SELECT count(*) FROM runs WHERE status = 'deferred'`))
	require.Equal(t, want, b.scalar(`SELECT sum(running)::int FROM tenant_running`))
	// The limit held: no key started more than 2 runs in any minute.
	require.Zero(t, b.scalar(`
		SELECT count(*) FROM (
			SELECT tenant, key, fired_at, count(*) AS n FROM deferred_groups
			WHERE mode = 'throttle' GROUP BY tenant, key, fired_at) x
		WHERE n > 2`))
}

// Gateways filling batches while janitors fire them at max_wait: every
// member lands in exactly one run, no run exceeds max_size, and each
// member resolves to the run that holds its input.
func TestRacingAcceptsAndFirersSplitBatchesExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		writers = 8
		each    = 10
		maxSize = 4
	)
	spec := fmt.Sprintf(`{"key": "k", "max_size": %d, "max_wait": "1m"}`, maxSize)
	g := pool.New().WithErrors()
	for w := range writers {
		g.Go(func() error {
			for i := range each {
				if _, err := b.try(startOpts{ID: fmt.Sprintf("m%d-%d", w, i), Batch: spec, Input: fmt.Sprint(w*each + i)}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for range 3 {
		g.Go(func() error {
			for range 10 {
				if _, err := deferred.Fire(b.ctx, b.db, deferred.FireOptions{Now: at(b, 2*time.Minute)}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	b.fire(2 * time.Minute) // what the racing firers left

	rows, err := b.db.Query(b.ctx, `
		SELECT r.id, t.input::text FROM runs r JOIN tasks t ON t.run_pk = r.pk`)
	require.NoError(t, err)
	holder := map[int]string{}
	for rows.Next() {
		var id, in string
		require.NoError(t, rows.Scan(&id, &in))
		var inputs []int
		require.NoError(t, json.Unmarshal([]byte(in), &inputs))
		require.LessOrEqual(t, len(inputs), maxSize)
		require.NotEmpty(t, inputs)
		// Arrival order: each writer's members, sent one after the other,
		// appear in the order they were sent.
		last := map[int]int{}
		for _, v := range inputs {
			if prev, ok := last[v/each]; ok {
				require.Greater(t, v, prev)
			}
			last[v/each] = v
			_, dup := holder[v]
			require.False(t, dup, "input %d in two runs", v)
			holder[v] = id
		}
	}
	require.NoError(t, rows.Err())
	require.Len(t, holder, writers*each)
	for w := range writers {
		for i := range each {
			run := b.get(fmt.Sprintf("m%d-%d", w, i))
			require.Equal(t, holder[w*each+i], run.RunID)
			require.Equal(t, api.StatusQueued, run.Status)
		}
	}
	require.Zero(t, b.scalar(`SELECT count(*) FROM deferred_groups WHERE state <> 'fired'`))
	runs, _ := b.runs()
	require.Equal(t, runs, b.running())
}
