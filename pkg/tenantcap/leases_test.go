package tenantcap_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

type leasesBundle struct {
	ctx    context.Context
	dbs    []*pgxpool.Pool
	leases *tenantcap.Leases
}

// setupLeases makes shards fresh shard databases and Leases over them.
func setupLeases(t *testing.T, shards, maxRuns, block int) *leasesBundle {
	t.Helper()
	b := &leasesBundle{ctx: context.Background()}
	var pools []shard.Beginner
	for range shards {
		db := testsvc.NewDB(t)
		b.dbs = append(b.dbs, db)
		pools = append(pools, db)
	}
	var err error
	b.leases, err = tenantcap.NewLeases(tenantcap.LeasesOptions{Shards: pools, MaxRuns: maxRuns, Block: block})
	require.NoError(t, err)
	return b
}

// start is what a start transaction does with the lease: under the
// shard's admission lock, count one more run when the lease has room.
func (b *leasesBundle) start(t *testing.T, shard int) bool {
	t.Helper()
	admitted := false
	err := pgx.BeginFunc(b.ctx, b.dbs[shard], func(tx pgx.Tx) error {
		// The lock first, in a statement of its own: a statement's
		// snapshot is taken before it runs, so reading the counts in the
		// statement that waits for the lock would read them stale.
		if _, err := tx.Exec(b.ctx, `SELECT harvest_shard_admission_lock()`); err != nil {
			return err
		}
		var running, lease int64
		if err := tx.QueryRow(b.ctx, `SELECT coalesce((SELECT sum(running) FROM tenant_running), 0)::bigint,
			harvest_shard_lease()`).Scan(&running, &lease); err != nil {
			return err
		}
		if running >= lease {
			return nil
		}
		admitted = true
		_, err := tx.Exec(b.ctx, `INSERT INTO tenant_running (tenant, running) VALUES ('t', 1)
			ON CONFLICT (tenant) DO UPDATE SET running = tenant_running.running + 1`)
		return err
	})
	require.NoError(t, err)
	return admitted
}

// finish ends one unfinished run of the shard, if it has one.
func (b *leasesBundle) finish(t *testing.T, shard int) {
	t.Helper()
	_, err := b.dbs[shard].Exec(b.ctx, `UPDATE tenant_running SET running = running - 1 WHERE tenant = 't' AND running > 0`)
	require.NoError(t, err)
}

// check requires the invariants that make the limit exact: the ledger
// holds at most maxRuns, and each shard's lease covers its unfinished
// runs. Each figure is read in one statement, so each holds at an instant.
// (That a lease never exceeds the ledger's account of it cannot be checked
// this way: a transfer may fall between the two reads.)
func (b *leasesBundle) check(t *testing.T, maxRuns int) {
	t.Helper()
	ledger, err := b.leases.Ledger(b.ctx)
	require.NoError(t, err)
	sum := 0
	for s, held := range ledger {
		sum += held
		st, err := b.leases.State(b.ctx, s)
		require.NoError(t, err)
		require.LessOrEqual(t, st.Running, int64(st.Lease()), "shard %d: runs beyond its lease", s)
	}
	require.LessOrEqual(t, sum, maxRuns, "the ledger holds more than max_runs: %v", ledger)
}

// Capacity moves between two shards under concurrent starts, finishes,
// acquisitions and returns, and the invariants hold throughout; once
// everything is synced, no capacity was lost or made: each shard holds
// what the ledger says.
func TestLeasesNeverExceedMaxRuns(t *testing.T) {
	t.Parallel()
	const maxRuns = 20
	b := setupLeases(t, 2, maxRuns, 3)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var checker sync.WaitGroup
	checker.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				b.check(t, maxRuns)
			}
		}
	})
	var admitted [2]int
	var mu sync.Mutex
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 60 {
				s := r.IntN(2)
				switch r.IntN(4) {
				case 0:
					_, err := b.leases.Acquire(b.ctx, s, 0, r.IntN(maxRuns)+1)
					require.NoError(t, err)
				case 1:
					_, err := b.leases.GiveBack(b.ctx, s, r.IntN(3))
					if err != nil {
						require.ErrorContains(t, err, "busy")
					}
				case 2:
					if b.start(t, s) {
						mu.Lock()
						admitted[s]++
						mu.Unlock()
					}
				default:
					b.finish(t, s)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	checker.Wait()
	b.check(t, maxRuns)
	require.Positive(t, admitted[0]+admitted[1])
	for s := range 2 {
		_, err := b.leases.Sync(b.ctx, s)
		require.NoError(t, err)
	}
	ledger, err := b.leases.Ledger(b.ctx)
	require.NoError(t, err)
	for s := range 2 {
		st, err := b.leases.State(b.ctx, s)
		require.NoError(t, err)
		require.Equal(t, ledger[s], st.Lease(), "shard %d after sync", s)
	}
}

// A crash between the two steps of a transfer loses capacity until the
// next sync and never creates it: a grant written to the ledger but not
// taken in by the shard, and a return written by the shard but not taken
// in by the ledger, are both finished by Sync (which Run calls).
func TestLeaseTransfersCrashSafe(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 2, 10, 2)
	got, err := b.leases.Acquire(b.ctx, 0, 0, 6)
	require.NoError(t, err)
	require.Equal(t, 6, got)

	// A grant of 4 to shard 1 reached the ledger; the gateway died before
	// shard 1 took it in.
	_, err = b.dbs[0].Exec(b.ctx, `INSERT INTO admission_ledger (shard, granted) VALUES (1, 4)`)
	require.NoError(t, err)
	st, err := b.leases.State(b.ctx, 1)
	require.NoError(t, err)
	require.Zero(t, st.Lease(), "not taken in yet: lost for now")
	got, err = b.leases.Acquire(b.ctx, 0, 0, 7)
	require.NoError(t, err)
	require.Equal(t, 6, got, "the ledger counts the lost grant: nothing is made")

	// Shard 0 gave back 3; the gateway died before the ledger took it in.
	_, err = b.dbs[0].Exec(b.ctx, `UPDATE admission_lease SET returned = returned + 3`)
	require.NoError(t, err)
	ledger, err := b.leases.Ledger(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []int{6, 4}, ledger, "the ledger still counts what shard 0 gave back")

	require.NoError(t, b.leases.Tidy(b.ctx))
	ledger, err = b.leases.Ledger(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []int{3, 4}, ledger)
	for s, want := range []int{3, 4} {
		st, err := b.leases.State(b.ctx, s)
		require.NoError(t, err)
		require.Equal(t, want, st.Lease(), "shard %d", s)
	}
	// Tidying again changes nothing: a transfer applied twice is applied
	// once.
	require.NoError(t, b.leases.Tidy(b.ctx))
	ledger, err = b.leases.Ledger(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []int{3, 4}, ledger)
}

// When the ledger is short, a shard takes back the other shards' idle
// capacity, but never what their unfinished runs use; one shard is
// granted all of max_runs at once.
func TestLeaseAcquireReclaimsIdleCapacity(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 2, 10, 0)
	require.Equal(t, 2, b.leases.Block(), "max_runs over four times the shards, rounded up")
	got, err := b.leases.Acquire(b.ctx, 0, 0, 8)
	require.NoError(t, err)
	require.Equal(t, 8, got)
	for range 5 {
		require.True(t, b.start(t, 0))
	}
	got, err = b.leases.Acquire(b.ctx, 1, 0, 5)
	require.NoError(t, err)
	require.Equal(t, 5, got, "2 free in the ledger and 3 idle on shard 0")
	st, err := b.leases.State(b.ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 5, st.Lease(), "shard 0 keeps what its runs use")
	got, err = b.leases.Acquire(b.ctx, 1, 0, 6)
	require.NoError(t, err)
	require.Equal(t, 5, got, "nothing idle is left")

	one := setupLeases(t, 1, 10, 0)
	require.Equal(t, 10, one.leases.Block())
	got, err = one.leases.Acquire(one.ctx, 0, 0, 1)
	require.NoError(t, err)
	require.Equal(t, 10, got)
}

// Shards asking for capacity for the first time at once (each grant makes
// its shard's ledger row) cannot each see the others' rows missing: the
// ledger never grants more than max_runs in all.
func TestFirstGrantsAtOnceShareMaxRuns(t *testing.T) {
	t.Parallel()
	const maxRuns = 10
	b := setupLeases(t, 6, maxRuns, 1)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for s := range 6 {
		wg.Go(func() {
			<-start
			_, err := b.leases.Acquire(b.ctx, s, 0, maxRuns)
			require.NoError(t, err)
		})
	}
	close(start)
	wg.Wait()
	// (A shard's capacity may have been taken back by another since its
	// Acquire returned: the shards' leases now are what counts.)
	b.check(t, maxRuns)
	leases, sum := make([]int, 6), 0
	for s := range 6 {
		st, err := b.leases.State(b.ctx, s)
		require.NoError(t, err)
		leases[s] = st.Lease()
		sum += st.Lease()
	}
	require.LessOrEqual(t, sum, maxRuns, "leases %v", leases)
}

// Several Acquires of one shard at once, which the ledger can all satisfy,
// each end with the lease they asked for: one that finds another's grant
// in the ledger, not yet taken in by the shard, counts it instead of
// asking for the whole shortfall again and finding too little free.
func TestConcurrentAcquiresOfOneShardShareTheGrant(t *testing.T) {
	t.Parallel()
	const maxRuns = 10
	for round := range 5 {
		b := setupLeases(t, 2, maxRuns, 1)
		start := make(chan struct{})
		got := make([]int, 8)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				<-start
				var err error
				got[i], err = b.leases.Acquire(b.ctx, 0, 0, maxRuns)
				require.NoError(t, err)
			})
		}
		close(start)
		wg.Wait()
		for i, g := range got {
			require.Equal(t, maxRuns, g, "round %d, Acquire %d of %v", round, i, got)
		}
	}
}

// Capacity that starts admitted after the caller saw the shard's count is
// not the caller's: Acquire grows need by the runs the shard admitted
// since then.
func TestAcquireCountsRunsAdmittedSinceSeen(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 2, 20, 1)
	got, err := b.leases.Acquire(b.ctx, 0, 0, 4)
	require.NoError(t, err)
	require.Equal(t, 4, got)
	// Another group spends the capacity this caller's need was worked
	// out against.
	for range 4 {
		require.True(t, b.start(t, 0))
	}
	got, err = b.leases.Acquire(b.ctx, 0, 0, 4)
	require.NoError(t, err)
	require.Equal(t, 8, got, "4 more than the 4 runs admitted since the count 0 was seen")
	got, err = b.leases.Acquire(b.ctx, 0, 4, 8)
	require.NoError(t, err)
	require.Equal(t, 8, got, "seen now: nothing more")
}
