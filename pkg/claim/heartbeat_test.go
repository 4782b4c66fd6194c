package claim_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// leaseMany makes n running tasks of new runs, each under its own lease of
// lease, and returns them in id order.
func (b *bundle) leaseMany(n int, lease time.Duration) []claim.Lease {
	b.t.Helper()
	out := make([]claim.Lease, n)
	for i := range out {
		id := b.task(taskOpts{})
		res, err := claim.ClaimByID(b.ctx, b.db, id, claim.Request{Queue: "q", Worker: "w", Lease: lease})
		require.NoError(b.t, err)
		require.True(b.t, res.OK)
		out[i] = claim.Lease{ID: id, Token: res.Task.LeaseToken}
	}
	return out
}

// One statement beats for every task a worker holds: each lease is
// extended under its own token, a lost lease and a cancelled run are told
// apart, and a lost lease is not extended.
func TestHeartbeatsExtendEveryLeaseInOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Leases of a minute, so that none runs out while the test runs (the
	// lost one is not extended, and a loaded machine takes seconds to get
	// here): the beats extend the others to an hour.
	leases := b.leaseMany(40, time.Minute)
	lost, cancelled := leases[7], leases[23]
	b.exec(`UPDATE tasks SET lease_token = gen_random_uuid() WHERE id = $1`, lost.ID)
	b.exec(`SELECT harvest_run_finish(run_pk, 'cancelled', NULL, 'by test') FROM tasks WHERE id = $1`, cancelled.ID)
	lostBefore := b.row(lost.ID)
	unknown := claim.Lease{ID: 1 << 40, Token: uuid.New()}

	var before time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT now()`).Scan(&before))
	beats, err := claim.Heartbeats(b.ctx, b.db, append(leases, unknown), time.Hour)
	require.NoError(t, err)
	require.Len(t, beats, len(leases)+1)
	for i, l := range leases {
		want := claim.BeatOK
		switch l {
		case lost:
			want = claim.BeatStale
		case cancelled:
			want = claim.BeatCancelled
		}
		require.Equal(t, want, beats[i], "task %d", l.ID)
		if l == lost {
			require.Equal(t, lostBefore, b.row(l.ID), "a lost lease is left as it was")
			continue
		}
		r := b.row(l.ID)
		require.Equal(t, "running", r.State)
		require.False(t, r.Expires.Before(before.Add(time.Hour)), "task %d: lease until %s", l.ID, r.Expires)
	}
	require.Equal(t, claim.BeatNotFound, beats[len(leases)])

	// Nothing expired: a rescue finds nothing to put back.
	res, err := claim.RescueExpired(b.ctx, b.db, 100)
	require.NoError(t, err)
	require.Zero(t, res.Requeued+res.Failed)
}

// A heartbeat rewrites only the lease's expiry, which no index names: it
// is a HOT update, writing no index entry.
func TestHeartbeatIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	leases := b.leaseMany(20, time.Minute)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // read-only use; rolled back
	// The backend's counters not yet flushed to the shared statistics:
	// they may hold earlier transactions of the connection, so only their
	// growth within this transaction (no flush happens inside it) counts.
	counts := func() (upd, hot int) {
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)
			FROM pg_stat_xact_user_tables WHERE relname = 'tasks'`).Scan(&upd, &hot))
		return upd, hot
	}
	upd0, hot0 := counts()
	// The single heartbeat of one task, then the heartbeat of the others.
	_, err = claim.Heartbeat(b.ctx, tx, leases[0].ID, leases[0].Token, time.Hour)
	require.NoError(t, err)
	upd1, hot1 := counts()
	require.Equal(t, 1, upd1-upd0)
	require.Equal(t, 1, hot1-hot0, "a single heartbeat is a HOT update")
	beats, err := claim.Heartbeats(b.ctx, tx, leases[1:], time.Hour)
	require.NoError(t, err)
	for _, beat := range beats {
		require.Equal(t, claim.BeatOK, beat)
	}
	upd, hot := counts()
	require.Equal(t, len(leases)-1, upd-upd1, "one update per lease")
	require.Equal(t, upd-upd1, hot-hot1, "every heartbeat of a task is a HOT update")
}

// The rescue finds exactly the expired leases: not a live one, not one
// just extended by a heartbeat, not a task that is done, and the earliest
// expiries first when it is limited.
func TestRescueTakesExactlyTheExpiredLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	leases := b.leaseMany(30, time.Minute)
	var expired, live []claim.Lease
	for i, l := range leases {
		if i%3 == 0 {
			// Expired, the earlier the lower the id.
			b.exec(`UPDATE tasks SET lease_expires_at = now() - (100 - $2::int) * interval '1 second' WHERE id = $1`, l.ID, i)
			expired = append(expired, l)
		} else {
			live = append(live, l)
		}
	}
	// Expired a moment ago, then beaten: live again.
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, live[0].ID)
	beats, err := claim.Heartbeats(b.ctx, b.db, live, time.Minute)
	require.NoError(t, err)
	for _, beat := range beats {
		require.Equal(t, claim.BeatOK, beat)
	}
	// Done with an old expiry would be a bug elsewhere; a finished task
	// has none, and is never rescued.
	done := b.leaseMany(1, time.Minute)[0]
	require.NoError(t, claim.Complete(b.ctx, b.db, done.ID, done.Token, nil))

	res, err := claim.RescueExpired(b.ctx, b.db, 4)
	require.NoError(t, err)
	require.Equal(t, 4, res.Requeued)
	for i, l := range expired {
		want := "running"
		if i < 4 {
			want = "pending"
		}
		require.Equal(t, want, b.row(l.ID).State, "expired lease %d (%d of them)", l.ID, i)
	}
	res, err = claim.RescueExpired(b.ctx, b.db, 100)
	require.NoError(t, err)
	require.Equal(t, len(expired)-4, res.Requeued)
	for _, l := range expired {
		require.Equal(t, "pending", b.row(l.ID).State)
	}
	for _, l := range live {
		require.Equal(t, "running", b.row(l.ID).State, "live lease %d", l.ID)
	}
	require.Equal(t, "done", b.row(done.ID).State)
	res, err = claim.RescueExpired(b.ctx, b.db, 100)
	require.NoError(t, err)
	require.Zero(t, res.Requeued+res.Failed)
}
