package claim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// A fair claimer and an ordinary claimer that each claim twice in one
// transaction, as a batch claims in several steps, do not deadlock on a
// quota row. The interleaving that did (the lock cycle behind the rare
// "deadlock detected" of TestConcurrencyCapHoldsUnderConcurrentClaims):
//
//	F: claims capped row C and so holds the quota row of "capped";
//	O: claims R, the first row no one holds;
//	F: its next fair pick is R, the head of its key: it waits for O;
//	O: its next pick is capped row C2: it waits for the quota row, held
//	   by F.
//
// Each claimer goes on with its second claim once the other has made its
// first or is waiting for a lock, and commits after its second; every
// claim must succeed.
func TestFairAndOrdinaryClaimsInTurnDoNotDeadlockOnAQuota(t *testing.T) {
	b := setup(t)
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'capped', 2)`)
	run := b.run(runOpts{})
	c := b.task(taskOpts{RunPK: run, Key: "kc", QuotaKey: "capped"})
	b.task(taskOpts{RunPK: run, Key: "kr"})
	b.task(taskOpts{RunPK: run, Key: "kc2", QuotaKey: "capped"})

	begin := func() (pgx.Tx, int32) {
		tx, err := b.db.Begin(b.ctx)
		require.NoError(t, err)
		var pid int32
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		return tx, pid
	}
	txF, pidF := begin()
	defer txF.Rollback(b.ctx)
	txO, pidO := begin()
	defer txO.Rollback(b.ctx)
	fair := claim.Request{Queue: "q", Worker: "f", Fair: true}
	ordinary := claim.Request{Queue: "q", Worker: "o"}

	first, err := claim.Claim(b.ctx, txF, fair)
	require.NoError(t, err)
	require.True(t, first.OK)
	require.Equal(t, c, first.Task.ID, "the fair claimer holds the capped key's quota row")

	// waitFor returns once done is closed or pid waits for a lock.
	waitFor := func(done <-chan struct{}, pid int32) {
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			var waiting bool
			err := b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`,
				pid).Scan(&waiting)
			if err != nil || waiting {
				return
			}
		}
	}
	// Each claimer's second claim waits until the other has made its
	// first claim (or ended) or waits for a lock.
	fDone, oFirst := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() {
		defer close(fDone)
		waitFor(oFirst, pidO)
		_, err := claim.Claim(b.ctx, txF, fair)
		if err == nil {
			err = txF.Commit(b.ctx)
		}
		errs <- err
	}()
	go func() {
		_, err := claim.Claim(b.ctx, txO, ordinary)
		close(oFirst)
		if err == nil {
			waitFor(fDone, pidF)
			_, err = claim.Claim(b.ctx, txO, ordinary)
		}
		if err == nil {
			err = txO.Commit(b.ctx)
		}
		errs <- err
	}()
	for range 2 {
		select {
		case err := <-errs:
			var deadlock bool
			if err != nil {
				deadlock = errors.Is(err, claim.ErrDeadlock)
			}
			require.False(t, deadlock, "the claims deadlocked: %v", err)
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("the claims hang")
		}
	}
}
