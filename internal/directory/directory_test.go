package directory

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

type bundle struct {
	ctx context.Context
	db  *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{ctx: context.Background(), db: testsvc.NewDB(t)}
}

// Callers that meet a new tenant at once all get the one entry recorded,
// at the rendezvous home.
func TestPlaceRecordsOneHome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var wg sync.WaitGroup
	got := make([]Entry, 8)
	for i := range got {
		wg.Go(func() {
			e, err := Place(b.ctx, b.db, "acme", shards.Home("acme", 3))
			require.NoError(t, err)
			got[i] = e
		})
	}
	wg.Wait()
	for _, e := range got {
		require.Equal(t, got[0], e)
	}
	require.Equal(t, shards.Home("acme", 3), got[0].Shard)
	require.Equal(t, PhaseHome, got[0].Phase)
	require.Equal(t, PlacedByHash, got[0].PlacedBy)

	// A caller with another shard count finds the recorded home.
	e, err := Place(b.ctx, b.db, "acme", 9)
	require.NoError(t, err)
	require.Equal(t, got[0], e)
}

// Update writes only over the version it read.
func TestUpdateIsOptimistic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e, err := Place(b.ctx, b.db, "globex", 0)
	require.NoError(t, err)
	to := 2
	e.Phase, e.MoveTo, e.PlacedBy = PhaseFencing, &to, PlacedByMove
	moved, err := Update(b.ctx, b.db, e)
	require.NoError(t, err)
	require.Equal(t, e.Version+1, moved.Version)
	require.Equal(t, 2, moved.Target())
	_, err = Update(b.ctx, b.db, e)
	require.ErrorIs(t, err, ErrStale)

	// The table's checks keep a phase and its fields together.
	bad := moved
	bad.Phase = PhaseHome
	_, err = Update(b.ctx, b.db, bad)
	require.Error(t, err)

	_, ok, err := Insert(b.ctx, b.db, "globex", 1, PlacedByPin)
	require.NoError(t, err)
	require.False(t, ok, "globex has an entry")
	all, err := List(b.ctx, b.db)
	require.NoError(t, err)
	require.Len(t, all, 1)
}

// A Directory hears of a change over NATS; without the event, its next
// re-read of shard 0 catches it.
func TestDirectoryFollowsChanges(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	b := setup(t)
	nc, err := nats.Connect(testsvc.NATSURL(t))
	require.NoError(t, err)
	defer nc.Close()
	prefix := "dirtest"
	d := New(Options{Shard0: b.db, Shards: 3, NATS: nc, Prefix: prefix, Refresh: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e, err := d.Home(b.ctx, "initech")
	require.NoError(t, err)
	require.Equal(t, shards.Home("initech", 3), e.Shard)

	move := func(shard int) Entry {
		cur, err := Get(b.ctx, b.db, "initech")
		require.NoError(t, err)
		cur.Shard = shard
		out, err := Update(b.ctx, b.db, cur)
		require.NoError(t, err)
		return out
	}
	next := (e.Shard + 1) % 3
	changed := move(next)
	require.NoError(t, Announce(b.ctx, nc, prefix, changed))
	require.Eventually(t, func() bool { c, _ := d.Cached("initech"); return c.Shard == next },
		time.Minute, 10*time.Millisecond, "the change event")

	// A message that is not an event, and one for a version held, change
	// nothing.
	require.NoError(t, nc.Publish(dispatch.Subjects{Prefix: prefix}.Tenants(), []byte("{")))
	old, _ := json.Marshal(dispatch.TenantChanged{Tenant: "initech", Version: 1})
	require.NoError(t, nc.Publish(dispatch.Subjects{Prefix: prefix}.Tenants(), old))

	last := 2 // not shard 0, for the check at the end
	if next == 2 {
		last = 1
	}
	move(last) // no event: the re-read finds it
	require.Eventually(t, func() bool { c, _ := d.Cached("initech"); return c.Shard == last },
		time.Minute, 10*time.Millisecond, "the periodic re-read")

	// An entry beyond the configured shards is refused, not followed.
	small := New(Options{Shard0: b.db, Shards: 1})
	_, err = small.Home(b.ctx, "initech")
	require.ErrorContains(t, err, "HARVEST_SHARDS")
}

// ReloadStale reads shard 0 only for an entry older than the age asked.
func TestReloadStaleSparesFreshEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := New(Options{Shard0: b.db, Shards: 3})
	e, err := d.Home(b.ctx, "hooli")
	require.NoError(t, err)
	cur, err := Get(b.ctx, b.db, "hooli")
	require.NoError(t, err)
	cur.Shard = (e.Shard + 1) % 3
	changed, err := Update(b.ctx, b.db, cur)
	require.NoError(t, err)

	got, err := d.ReloadStale(b.ctx, "hooli", time.Hour)
	require.NoError(t, err)
	require.Equal(t, e, got, "read less than an hour ago: the cached entry")
	got, err = d.ReloadStale(b.ctx, "hooli", 0)
	require.NoError(t, err)
	require.Equal(t, changed, got, "any age: read again")
}
