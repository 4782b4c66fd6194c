package janitor_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/api"
)

// deferOpts describes a deferred start made by the factory.
type deferOpts struct {
	ID       string        // "d"
	Debounce string        // the raw debounce object; a 1s window when empty
	Ago      time.Duration // accepted this long before the database clock's now
}

func (b *bundle) deferStart(o deferOpts) deferred.Result {
	b.t.Helper()
	if o.ID == "" {
		o.ID = "d"
	}
	if o.Debounce == "" {
		o.Debounce = `{"period": "1s"}`
	}
	var now time.Time
	require.NoError(b.t, b.db.QueryRow(b.ctx, `SELECT now()`).Scan(&now))
	res, err := deferred.Start(b.ctx, b.db, deferred.Params{
		Tenant: "acme",
		Req:    api.StartRequest{ID: o.ID, Name: "wf", Queue: "q", Debounce: json.RawMessage(o.Debounce)},
		Now:    now.Add(-o.Ago),
	})
	require.NoError(b.t, err)
	return res
}

func TestTickFiresDueDeferredStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := b.deferStart(deferOpts{ID: "due", Ago: time.Minute})
	b.deferStart(deferOpts{ID: "later", Debounce: `{"key": "x", "period": "1h"}`})

	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.DeferredFired)
	// What fired is reported for the caller to announce.
	require.Len(t, rep.DeferredStarted, 1)
	require.Equal(t, due.Run.RunID, rep.DeferredStarted[0].Params.Req.ID)
	require.Equal(t, map[string]int{"q": 1}, rep.WakeQueues())
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM runs WHERE status = 'queued' AND id = $1`, due.Run.RunID))
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM runs WHERE status = 'deferred'`))
	// The recount agrees with the slots deferred starts hold.
	require.Zero(t, rep.Recounted)
	require.Equal(t, 2, b.scalar(`SELECT running FROM tenant_running WHERE tenant = 'acme'`))

	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Zero(t, rep.DeferredFired)
	require.Nil(t, rep.WakeQueues())
}

// Every worker runs a janitor: racing ticks fire each window once.
func TestRacingJanitorsFireEachDeferredStartOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const windows = 40
	for i := range windows {
		b.deferStart(deferOpts{ID: fmt.Sprint("w", i), Debounce: fmt.Sprintf(`{"key": "k%d", "period": "1s"}`, i), Ago: time.Minute})
	}
	g := pool.NewWithResults[int]().WithErrors()
	for range 6 {
		g.Go(func() (int, error) {
			rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
			return rep.DeferredFired, err
		})
	}
	fired, err := g.Wait()
	require.NoError(t, err)
	total := 0
	for _, n := range fired {
		total += n
	}
	require.Equal(t, windows, total)
	require.Equal(t, windows, b.scalar(`SELECT count(*) FROM runs WHERE status = 'queued'`))
	require.Equal(t, windows, b.scalar(`SELECT count(*) FROM tasks`))
}

func TestTickPrunesFinishedDeferredGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.deferStart(deferOpts{Ago: time.Minute})
	_, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	// The run finished and retention deleted it: its group goes next.
	_, err = b.db.Exec(b.ctx, `
		SELECT harvest_run_finish(pk, 'completed', NULL, NULL) FROM runs WHERE id = $1;`, res.Run.RunID)
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET state = 'done'; UPDATE runs SET finished_at = now() - interval '8 days'`)
	require.NoError(t, err)
	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Equal(t, 1, rep.DeletedRuns)
	require.Equal(t, 1, rep.DeferredPruned, "in the same tick, after the run")
	require.Zero(t, b.scalar(`SELECT count(*) FROM deferred_starts`))
}
