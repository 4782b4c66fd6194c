package deferred_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// requireRefused checks that a start got 429 and left nothing behind.
func (b *bundle) requireRefused(o startOpts) {
	b.t.Helper()
	_, err := b.try(o)
	var ae *api.Error
	require.ErrorAs(b.t, err, &ae, o.ID)
	require.Equal(b.t, 429, ae.Status, o.ID)
	require.Equal(b.t, api.CodeOverLimit, ae.Code, o.ID)
	tenant := o.Tenant
	if tenant == "" {
		tenant = "acme"
	}
	_, err = deferred.Get(b.ctx, b.db, tenant, o.ID, 0)
	require.ErrorIs(b.t, err, runstore.ErrNotFound, "a refused start leaves nothing: %s", o.ID)
}

// requireExact checks that every tenant's running count equals its
// unfinished runs, as the janitor's recount would find them.
func (b *bundle) requireExact() {
	b.t.Helper()
	drift, err := tenantcap.Drift(b.ctx, b.db)
	require.NoError(b.t, err)
	require.Empty(b.t, drift, "running counts differ from a recount")
}

// A start that joins an open debounce window or batch is asked as a start
// that adds a run: at the limit it gets 429 and changes nothing, while
// another tenant is not affected; nothing is counted for it, so the count
// stays a recount of the unfinished runs.
func TestJoinsAreAdmittedLikeAnyStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	adm := limitAdmitter{limit: 2}
	deb := `{"key": "d", "period": "10s"}`
	bat := `{"key": "b", "max_size": 10, "max_wait": "1m"}`
	d1 := b.start(startOpts{ID: "d1", Debounce: deb, Input: `1`, Admitter: adm})
	b.start(startOpts{ID: "b1", Batch: bat, Input: `1`, Admitter: adm})
	require.Equal(t, 2, b.running(), "at the limit")

	b.requireRefused(startOpts{ID: "d2", Debounce: deb, Input: `2`, Admitter: adm, At: time.Second})
	b.requireRefused(startOpts{ID: "b2", Batch: bat, Input: `2`, Admitter: adm, At: time.Second})
	require.Equal(t, 2, b.scalar(`SELECT count(*) FROM deferred_starts`))
	require.Equal(t, 2, b.scalar(`SELECT sum(size)::int FROM deferred_groups`))
	require.Equal(t, 1, b.scalar(`SELECT input::int FROM runs WHERE id = $1`, d1.Run.RunID),
		"the refused start did not replace the request")
	require.True(t, b.get(d1.Run.RunID).FiresAt.Equal(at(b, 10*time.Second)), "nor push the window back")

	// Another tenant has its own count.
	other := startOpts{Tenant: "globex", Debounce: deb, Admitter: adm}
	b.start(other)
	other.At = time.Second
	require.Equal(t, api.StatusDeferred, b.start(other).Run.Status)
	require.Equal(t, 2, b.running())
	b.requireExact()

	// Below the limit a join is admitted and counts nothing.
	_, err := deferred.Cancel(b.ctx, b.db, "acme", "b1", 0, "user")
	require.NoError(t, err)
	j := b.start(startOpts{ID: "d3", Debounce: deb, Input: `3`, Admitter: adm, At: 2 * time.Second})
	require.Equal(t, d1.Run.RunID, j.Run.RunID)
	require.Equal(t, 1, b.running())
	b.requireExact()
}

// A debounce window takes DebounceMaxStarts starts: the start that brings
// it there fires it at once with its request, and the next start of the
// key opens a new window.
func TestDebounceWindowFiresAtItsLastStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deb := `{"key": "k", "period": "1h"}`
	var res []deferred.Result
	for i := range 3 {
		res = append(res, b.start(startOpts{ID: fmt.Sprint("s", i), Debounce: deb, Input: fmt.Sprint(i),
			MaxStarts: 3, At: time.Duration(i) * time.Second}))
	}
	runID := res[0].Run.RunID
	require.Equal(t, api.StatusDeferred, res[1].Run.Status)
	require.Empty(t, res[1].Started)
	require.Equal(t, api.StatusQueued, res[2].Run.Status, "the third start fires the window")
	require.Equal(t, runID, res[2].Run.RunID)
	require.Len(t, res[2].Started, 1, "for the gateway to announce")
	require.Equal(t, "2", b.taskInput(runID), "with the last start's request")
	require.Equal(t, api.StatusQueued, b.get("s0").Status)

	next := b.start(startOpts{ID: "s3", Debounce: deb, MaxStarts: 3, At: 3 * time.Second})
	require.Equal(t, api.StatusDeferred, next.Run.Status)
	require.NotEqual(t, runID, next.Run.RunID, "a new window")
	require.Zero(t, b.fire(time.Hour).Fired, "the full window does not fire again; the new one is not due")
	require.Equal(t, 1, b.fire(time.Hour+3*time.Second).Fired)
	require.Equal(t, 3, b.scalar(`SELECT size FROM deferred_groups WHERE run_id = $1`, runID))
	require.Equal(t, 2, b.running())
	b.requireExact()
}

// Without max_wait a window that keeps getting starts still fires
// DebounceMaxOpen after its first start.
func TestDebounceWithoutMaxWaitIsCapped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deb := `{"period": "100h"}`
	first := b.start(startOpts{Debounce: deb})
	require.True(t, first.Run.FiresAt.Equal(at(b, 100*time.Hour)))
	late := b.start(startOpts{Debounce: deb, At: 99 * time.Hour})
	require.True(t, late.Run.FiresAt.Equal(at(b, deferred.DebounceMaxOpen)),
		"capped at the first start plus %s: %s", deferred.DebounceMaxOpen, late.Run.FiresAt)
	require.Zero(t, b.fire(deferred.DebounceMaxOpen-time.Second).Fired)
	require.Equal(t, 1, b.fire(deferred.DebounceMaxOpen).Fired)
}

// recordingAdmitter admits a tenant up to limit unfinished runs and
// remembers the ids of the starts it admitted.
type recordingAdmitter struct {
	limit    int
	mu       sync.Mutex
	admitted map[string]bool
}

func (r *recordingAdmitter) Admit(ctx context.Context, a tenantcap.Admission) error {
	if err := (limitAdmitter{limit: r.limit}).Admit(ctx, a); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admitted[a.Tenant+"/"+a.Req.ID] = true
	return nil
}

// Debounce and batch starts, firings and cancels racing over a few keys
// and two tenants: every accepted start was asked, no tenant went past its
// limit, and the counts equal a recount of the unfinished runs.
func TestRacingJoinsFiresAndCancelsKeepCountsExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		limit   = 4
		writers = 4
		each    = 25
	)
	adm := &recordingAdmitter{limit: limit, admitted: map[string]bool{}}
	tenants := []string{"acme", "globex"}
	var (
		mu       sync.Mutex
		accepted []startOpts
	)
	g := pool.New().WithErrors()
	for w := range writers {
		g.Go(func() error {
			for i := range each {
				o := startOpts{Tenant: tenants[(w+i)%2], ID: fmt.Sprintf("w%d-%d", w, i), Admitter: adm, MaxStarts: 5,
					At: time.Duration(i) * time.Second}
				if i%3 == 2 {
					o.Batch = fmt.Sprintf(`{"key": "b%d", "max_size": 4, "max_wait": "10s"}`, i%2)
				} else {
					o.Debounce = fmt.Sprintf(`{"key": "d%d", "period": "5s"}`, i%2)
				}
				res, err := b.try(o)
				var ae *api.Error
				switch {
				case errors.As(err, &ae) && ae.Status == 429:
					continue
				case err != nil:
					return fmt.Errorf("%s: %w", o.ID, err)
				}
				if res.Created {
					mu.Lock()
					accepted = append(accepted, o)
					mu.Unlock()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		for i := range 30 {
			if _, err := deferred.Fire(b.ctx, b.db, deferred.FireOptions{Now: at(b, time.Duration(i)*time.Second)}); err != nil {
				return err
			}
		}
		return nil
	})
	g.Go(func() error {
		for range 30 {
			mu.Lock()
			var o startOpts
			if len(accepted) > 0 {
				o = accepted[len(accepted)/2]
			}
			mu.Unlock()
			if o.ID == "" {
				continue
			}
			_, err := deferred.Cancel(b.ctx, b.db, o.Tenant, o.ID, 0, "test")
			if err != nil && !errors.Is(err, runstore.ErrFinished) {
				return fmt.Errorf("cancel %s: %w", o.ID, err)
			}
		}
		return nil
	})
	require.NoError(t, g.Wait())

	require.NotEmpty(t, accepted)
	for _, o := range accepted {
		require.True(t, adm.admitted[o.Tenant+"/"+o.ID], "start %s of %s was accepted without being admitted", o.ID, o.Tenant)
	}
	b.requireExact()
	for _, tn := range tenants {
		require.LessOrEqual(t, b.scalar(`SELECT coalesce(sum(running), 0)::int FROM tenant_running WHERE tenant = $1`, tn), limit)
	}
	// Whatever still waits fires, and the counts stay exact.
	b.fire(time.Hour)
	b.requireExact()
	require.LessOrEqual(t, b.scalar(`SELECT max(size) FROM deferred_groups WHERE mode = 'debounce'`), 5)
}
