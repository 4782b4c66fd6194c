package tenantmove

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/shards"
)

// Pin refuses a tenant that has runs, and for one without fences every
// other shard and records the home.
func TestPinFencesTheOtherShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.makeRun(t, 1, "busy", "r1", queued)
	_, err := Pin(b.ctx, b.o, "busy", 2)
	require.ErrorContains(t, err, "has 1 runs")
	require.ErrorContains(t, err, "harvest tenants move")

	e, err := Pin(b.ctx, b.o, "fresh", 2)
	require.NoError(t, err)
	require.Equal(t, 2, e.Shard)
	require.Equal(t, directory.PlacedByPin, e.PlacedBy)
	require.Equal(t, directory.PhaseHome, e.Phase)
	for s := range b.dbs {
		want := int64(1)
		if s == 2 {
			want = 0
		}
		require.Equal(t, want, b.count(t, s, `SELECT count(*) FROM tenant_fences WHERE tenant = 'fresh' AND moved_to = 2`), "shard %d", s)
	}
	// Pinned again elsewhere: the old pin's shard is fenced, the new one not.
	e, err = Pin(b.ctx, b.o, "fresh", 0)
	require.NoError(t, err)
	require.Equal(t, 0, e.Shard)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM tenant_fences WHERE tenant = 'fresh'`))
	require.EqualValues(t, 1, b.count(t, 2, `SELECT count(*) FROM tenant_fences WHERE tenant = 'fresh' AND moved_to = 0`))

	_, err = Pin(b.ctx, b.o, "bad name", 0)
	require.Error(t, err)
	_, err = Move(b.ctx, b.o, "fresh", 3)
	require.ErrorContains(t, err, "--to")
}

// List shows each tenant's home, its unfinished runs over all shards and
// its keys on the home; a tenant with runs but no entry has home -1.
func TestListShowsHomesCountsAndKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.home(t, "acme", 1)
	b.makeRun(t, 1, "acme", "a1", queued)
	b.makeRun(t, 1, "acme", "a2", completed)
	b.makeRun(t, 0, "acme", "a3", queued) // a leftover elsewhere
	b.makeRun(t, 2, "nohome", "n1", queued)
	_, err := b.dbs[1].Exec(b.ctx, `
		INSERT INTO fair_state (queue, key) VALUES ('q', 'acme/x'), ('q2', 'acme'), ('q', 'acme_y');`)
	require.NoError(t, err)
	_, err = Pin(b.ctx, b.o, "pinned", 0)
	require.NoError(t, err)

	got, err := List(b.ctx, b.o)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, "acme", got[0].Tenant)
	require.Equal(t, 1, got[0].Home)
	require.EqualValues(t, 2, got[0].Unfinished)
	require.EqualValues(t, 2, got[0].Keys)
	require.Equal(t, "nohome", got[1].Tenant)
	require.Equal(t, -1, got[1].Home)
	require.EqualValues(t, 1, got[1].Unfinished)
	require.Equal(t, "pinned", got[2].Tenant)
	require.Equal(t, 0, got[2].Home)
	require.Zero(t, got[2].Unfinished)

	// A shard that does not answer is named.
	o := b.o
	dead := setup(t).dbs[2]
	dead.Close()
	o.Shards = []*pgxpool.Pool{b.dbs[0], b.dbs[1], dead}
	_, err = List(b.ctx, o)
	require.ErrorContains(t, err, "shard 2")
}

// A second move of a tenant is refused while the first holds its lock,
// and a move to another shard than the one in progress names it.
func TestSecondMoveIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := "acme"
	from := shards.Home(tenant, len(b.dbs))
	to := (from + 1) % len(b.dbs)
	b.makeRun(t, from, tenant, "r1", queued)
	held, release := make(chan struct{}), make(chan struct{})
	errStop := errors.New("stop")
	done := make(chan error, 1)
	o := b.o
	o.AfterStep = func(s Step) error {
		if s.Name == "intent" {
			close(held)
			<-release
			return errStop
		}
		return nil
	}
	go func() {
		_, err := Move(b.ctx, o, tenant, to)
		done <- err
	}()
	<-held
	_, err := Move(b.ctx, b.o, tenant, to)
	require.ErrorContains(t, err, "a move of acme is already running")
	close(release)
	require.ErrorIs(t, <-done, errStop)

	other := (to + 1) % len(b.dbs)
	_, err = Move(b.ctx, b.o, tenant, other)
	require.ErrorContains(t, err, "in progress")
	require.ErrorContains(t, err, "--to")
	_, err = Move(b.ctx, b.o, tenant, to)
	require.NoError(t, err)
	b.invariants(t, tenant, []string{"r1"}, to)
}
