package tenantmove

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/pkg/claim"
)

// A move of a tenant with runs in every state copies each exactly once,
// with its history, leaves the other tenant alone, finishes a run whose
// task was running on the old home, carries fairness debt and settings,
// and leaves the moved pending work claimable on the new home.
func TestMoveCopiesEveryRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const src, dst = 1, 2
	b.home(t, "acme", src)
	var ids []string
	var busy fixture
	kinds := []runKind{queued, queued, scheduled, running, completed, failed, cancelled, queued}
	for i, k := range kinds {
		f := b.makeRun(t, src, "acme", fmt.Sprintf("r%d", i), k)
		ids = append(ids, f.id)
		if k == running {
			busy = f
		}
	}
	b.makeRun(t, src, "other", "o1", queued)
	b.makeRun(t, src, "other", "o2", running)
	// A debt of 2.5 behind the clock on the old home; the new home's
	// clock is elsewhere.
	_, err := b.dbs[src].Exec(b.ctx, `
		INSERT INTO fair_queues (queue, clock) VALUES ('q', 10);
		INSERT INTO fair_state (queue, key, pass, last_start, charged_at, in_debt)
		VALUES ('q', 'acme/a_b', 12.5, 10, now(), true), ('q', 'acmeX', 20, 10, now(), true);
		INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'acme', 3), ('q', 'acmeX', 2);
		INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'acme/x', 4);`)
	require.NoError(t, err)
	_, err = b.dbs[dst].Exec(b.ctx, `INSERT INTO fair_queues (queue, clock) VALUES ('q', 100)`)
	require.NoError(t, err)
	// One run not announced (its start did not ask): it stays so.
	_, err = b.dbs[src].Exec(b.ctx, `UPDATE runs SET notify = false WHERE tenant = 'acme' AND id = $1`, ids[0])
	require.NoError(t, err)

	o := b.o
	finished := false
	o.AfterStep = func(s Step) error {
		// The running task ends on the old home in the middle of the move.
		if s.Name == "drop" && !finished {
			finished = true
			return claim.Complete(b.ctx, b.dbs[src], busy.task, uuid.UUID(busy.token), json.RawMessage(`{"late":true}`))
		}
		return nil
	}
	rep, err := Move(b.ctx, o, "acme", dst)
	require.NoError(t, err)
	require.Equal(t, src, rep.From)
	require.Equal(t, dst, rep.To)
	require.Equal(t, len(kinds), rep.Runs)

	b.invariants(t, "acme", ids, dst)
	got := b.runsOf(t, dst, "acme")
	for i, k := range kinds {
		r := got[ids[i]]
		require.JSONEq(t, fmt.Sprintf(`{"n":%q}`, ids[i]), string(r.Input))
		want := map[runKind]string{queued: "queued", scheduled: "queued", running: "completed",
			completed: "completed", failed: "failed", cancelled: "cancelled"}[k]
		require.Equal(t, want, r.Status, ids[i])
		if k == running || k == completed || k == failed {
			require.Equal(t, 1, r.Attempts, ids[i])
		}
	}
	require.JSONEq(t, `{"late":true}`, string(got[busy.id].Output))
	require.EqualValues(t, 1, b.count(t, dst, `SELECT count(*) FROM runs WHERE tenant = 'acme' AND NOT notify`))
	require.EqualValues(t, 1, b.count(t, dst, `SELECT count(*) FROM runs WHERE tenant = 'acme' AND id = $1 AND NOT notify`, ids[0]))
	require.Len(t, b.runsOf(t, src, "other"), 2)
	require.Empty(t, b.runsOf(t, src, "acme"))

	e, err := directory.Get(b.ctx, b.dbs[0], "acme")
	require.NoError(t, err)
	require.Equal(t, directory.PhaseHome, e.Phase)
	require.Equal(t, dst, e.Shard)
	require.Equal(t, directory.PlacedByMove, e.PlacedBy)
	require.EqualValues(t, dst, b.count(t, src, `SELECT moved_to FROM tenant_fences WHERE tenant = 'acme'`))
	require.EqualValues(t, 4, b.count(t, dst, `SELECT running FROM tenant_running WHERE tenant = 'acme'`))
	require.Zero(t, b.count(t, src, `SELECT running FROM tenant_running WHERE tenant = 'acme'`))

	// The debt of the tenant's key is its lag on the new clock; a key of
	// another tenant that only shares the prefix stays behind.
	var pass, last float64
	require.NoError(t, b.dbs[dst].QueryRow(b.ctx,
		`SELECT pass, last_start FROM fair_state WHERE queue = 'q' AND key = 'acme/a_b' AND in_debt`).Scan(&pass, &last))
	require.InDelta(t, 102.5, pass, 1e-9)
	require.InDelta(t, 100, last, 1e-9)
	require.Zero(t, b.count(t, dst, `SELECT count(*) FROM fair_state WHERE key = 'acmeX'`))
	require.EqualValues(t, 1, b.count(t, dst, `SELECT count(*) FROM weight_overrides WHERE key = 'acme' AND weight = 3`))
	require.Zero(t, b.count(t, dst, `SELECT count(*) FROM weight_overrides WHERE key = 'acmeX'`))
	require.EqualValues(t, 1, b.count(t, dst, `SELECT count(*) FROM quotas WHERE quota_key = 'acme/x'`))

	// The queued runs are claimable on the new home, and finish there.
	for range 3 {
		res, err := claim.Claim(b.ctx, b.dbs[dst], claim.Request{Queue: "q", Worker: "w", Fair: true})
		require.NoError(t, err)
		require.True(t, res.OK)
		require.NoError(t, claim.Complete(b.ctx, b.dbs[dst], res.Task.ID, res.Task.LeaseToken, nil))
	}
	res, err := claim.Claim(b.ctx, b.dbs[dst], claim.Request{Queue: "q", Worker: "w", Fair: true})
	require.NoError(t, err)
	require.False(t, res.OK, "the scheduled run is not due")
	require.EqualValues(t, 1, b.count(t, dst, `SELECT running FROM tenant_running WHERE tenant = 'acme'`))
	b.invariants(t, "acme", ids, dst)

	// Moving it again to where it is does nothing.
	rep, err = Move(b.ctx, b.o, "acme", dst)
	require.NoError(t, err)
	require.True(t, rep.AlreadyHome)
}

// A move killed after any of its steps and run again ends as one that was
// never interrupted: no run lost or doubled, counts exact, nothing left
// half moved.
func TestMoveResumesAfterACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	// How many steps an uninterrupted move of the fixture takes.
	total := 0
	{
		b := setup(t)
		b.crashFixture(t)
		o := b.o
		o.AfterStep = func(Step) error { total++; return nil }
		_, err := Move(b.ctx, o, "acme", 2)
		require.NoError(t, err)
		// The member start's id stays reserved on the new home: an
		// ordinary run may not take it (runs_reserve_deferred_ids).
		_, err = b.dbs[2].Exec(b.ctx, `INSERT INTO runs (tenant, id, name, queue, request_hash)
			VALUES ('acme', 'm1', 'wf', 'q', '\x00')`)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "runs_id_reserved_by_deferred_start", pe.ConstraintName)
	}
	require.Greater(t, total, 10)
	boom := errors.New("crash")
	for k := 1; k <= total; k++ {
		// One at a time: each cut takes three fresh shards, and twenty
		// of them at once would take more connections than a stock
		// server allows beside the other packages' tests.
		t.Run(fmt.Sprintf("after step %d", k), func(t *testing.T) {
			b := setup(t)
			ids := b.crashFixture(t)
			o := b.o
			calls := 0
			var at Step
			o.AfterStep = func(s Step) error {
				calls++
				if calls == k {
					at = s
					return boom
				}
				return nil
			}
			_, err := Move(b.ctx, o, "acme", 2)
			require.ErrorIs(t, err, boom)
			_, err = Move(b.ctx, b.o, "acme", 2)
			require.NoError(t, err, "after %+v", at)
			b.invariants(t, "acme", ids, 2)
			b.invariants(t, "other", []string{"o1"}, 1)
			e, err := directory.Get(b.ctx, b.dbs[0], "acme")
			require.NoError(t, err)
			require.Equal(t, directory.PhaseHome, e.Phase)
			require.Equal(t, 2, e.Shard)
			// The waiting debounce window moved with its member start, and
			// fires on the new home.
			require.EqualValues(t, 1, b.count(t, 2, `SELECT count(*) FROM deferred_groups g
				JOIN deferred_starts s ON s.group_pk = g.pk WHERE g.run_id = 'dg' AND g.state = 'pending' AND s.id = 'm1'`))
			require.Zero(t, b.count(t, 1, `SELECT count(*) FROM deferred_groups`))
			require.EqualValues(t, 1, b.count(t, 2, `SELECT count(*) FROM runs WHERE id = 'dg' AND status = 'deferred'`))
		})
	}
}

// crashFixture gives acme ten runs on shard 1 (four batches of three),
// deferred history, and another tenant's run beside them.
func (b *bundle) crashFixture(t *testing.T) []string {
	t.Helper()
	b.home(t, "acme", 1)
	kinds := []runKind{queued, scheduled, completed, queued, failed, queued, cancelled, queued, scheduled}
	var ids []string
	for i, k := range kinds {
		ids = append(ids, b.makeRun(t, 1, "acme", fmt.Sprintf("r%d", i), k).id)
	}
	// A debounce window that waits (its run is 'deferred', counted) with
	// one member start.
	_, err := b.dbs[1].Exec(b.ctx, `
		WITH g AS (
		    INSERT INTO deferred_groups (tenant, run_id, mode, queue, key, fires_at, request, opened_at)
		    VALUES ('acme', 'dg', 'debounce', 'q', 'k', now() + interval '1 hour', '\x7b7d', now())
		    RETURNING pk)
		INSERT INTO deferred_starts (tenant, id, group_pk, position, request_hash, accepted_at)
		SELECT 'acme', 'm1', pk, 1, '\x00', now() FROM g;
		INSERT INTO runs (tenant, id, name, queue, request_hash, status) VALUES ('acme', 'dg', 'wf', 'q', '\x00', 'deferred');
		UPDATE tenant_running SET running = running + 1 WHERE tenant = 'acme';`)
	require.NoError(t, err)
	ids = append(ids, "dg")
	b.makeRun(t, 1, "other", "o1", queued)
	return ids
}
