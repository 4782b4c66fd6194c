package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Admission of debounce and batch starts that join an open window or
// batch, and the bound on a debounce window's starts, through the gateway.

// requireOverLimit sends body over HTTP and NATS as tenantOn[0] and
// requires 429 over_limit both ways.
func requireOverLimit(t *testing.T, b *bundle, body string) {
	t.Helper()
	status, out := b.call(t, "POST", "/v1/runs", secretA, body)
	require.Equal(t, 429, status, string(out))
	require.Equal(t, api.CodeOverLimit, apiErr(t, out).Code)
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], body)
	require.Equal(t, 429, status, string(out))
	require.Equal(t, api.CodeOverLimit, apiErr(t, out).Code)
}

// requireExactCounts checks that every tenant's running count on both
// shards equals its unfinished runs, as the janitor's recount finds them.
func requireExactCounts(t *testing.T, b *bundle) {
	t.Helper()
	for i, db := range b.dbs {
		drift, err := tenantcap.Drift(b.ctx, db)
		require.NoError(t, err)
		require.Empty(t, drift, "shard %d: running counts differ from a recount", i)
	}
}

// A tenant at its limit gets 429 for every debounce and batch start,
// whether it would open a window or join an open one, and the refused
// starts change nothing; another tenant's starts are admitted. Once a slot
// is free a join is admitted again and counts nothing.
func TestDeferredJoinAtTheLimitIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: eightTenants(t)})
	putAdmission(t, b, `{"algorithm": "static", "tfm": 1}`) // limit 16
	fillRuns(t, b, tenantOn[0], 14)
	deb := `"debounce":{"key":"a","period":"1h"}`
	bat := `"batch":{"key":"b","max_size":10,"max_wait":"1h"}`
	w1 := b.startRun(t, secretA, 201, deferredBody("adm", `"id":"w1","input":1,`+deb))
	b.startRun(t, secretA, 201, deferredBody("adm", `"id":"m1","input":1,`+bat))
	require.Equal(t, 16, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	requireOverLimit(t, b, deferredBody("adm", `"id":"w2","input":2,`+deb))                       // joins w1's window
	requireOverLimit(t, b, deferredBody("adm", `"id":"m2","input":2,`+bat))                       // joins m1's batch
	requireOverLimit(t, b, deferredBody("adm", `"id":"x1","debounce":{"key":"c","period":"1h"}`)) // a new window
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM deferred_starts`))
	require.Equal(t, 2, b.count(t, 0, `SELECT sum(size)::int FROM deferred_groups`))
	require.Equal(t, 1, b.count(t, 0, `SELECT input::int FROM runs WHERE id = $1`, w1.RunID), "the window's request is w1's")
	require.True(t, b.getRun(t, secretA, "w1").FiresAt.Equal(w1.FiresAt.Time), "the refused join did not push the window back")
	require.Equal(t, 16, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	// Another tenant, under its limit, opens and joins windows.
	o1 := b.startRun(t, secretB, 201, deferredBody("adm", `"id":"o1",`+deb))
	o2 := b.startRun(t, secretB, 201, deferredBody("adm", `"id":"o2",`+deb))
	require.Equal(t, o1.RunID, o2.RunID)
	requireExactCounts(t, b)

	// A free slot admits the join; the window still holds one slot.
	status, out := b.call(t, "POST", "/v1/runs/m1/cancel", secretA, nil)
	require.Equal(t, 200, status, string(out))
	w2 := b.startRun(t, secretA, 201, deferredBody("adm", `"id":"w2","input":2,`+deb))
	require.Equal(t, w1.RunID, w2.RunID)
	require.Equal(t, 15, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	requireExactCounts(t, b)
}

// A debounce window takes deferred.DefaultDebounceMaxStarts starts: the
// start that brings it there fires it at once (answered with the run,
// queued, and announced), and the next start opens a new window.
func TestDeferredDebounceWindowFiresAtItsStartBound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	deb := json.RawMessage(`{"key":"k","period":"1h"}`)
	reqs := make([]api.StartRequest, deferred.DefaultDebounceMaxStarts-1)
	for i := range reqs {
		reqs[i] = api.StartRequest{ID: fmt.Sprint("s", i), Name: "echo", Queue: "bound", Debounce: deb,
			Input: json.RawMessage(fmt.Sprint(i))}
	}
	status, out := b.call(t, "POST", "/v1/runs/batch", secretA, api.BatchStartRequest{Runs: reqs})
	require.Equal(t, 200, status, string(out))
	results := decode[api.BatchStartResponse](t, out).Results
	require.Len(t, results, len(reqs))
	runID := results[0].Run.RunID
	for i, r := range results {
		require.Nil(t, r.Error, "item %d", i)
		require.Equal(t, api.StatusDeferred, r.Run.Status, "item %d", i)
		require.Equal(t, runID, r.Run.RunID, "item %d", i)
	}

	wakes := b.wakes(t, 0, "bound")
	last := b.startRun(t, secretA, 201, deferredBody("bound", `"id":"last","input":"last","debounce":{"key":"k","period":"1h"}`))
	require.Equal(t, api.StatusQueued, last.Status, "the last start fires the window")
	require.Equal(t, runID, last.RunID)
	requireWake(t, wakes, 1)
	require.Equal(t, api.StatusQueued, b.getRun(t, secretA, "s0").Status)
	var input string
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT t.input::text FROM tasks t JOIN runs r ON r.pk = t.run_pk
		WHERE r.id = $1`, runID).Scan(&input))
	require.Equal(t, `"last"`, input, "the run has the last start's request")

	next := b.startRun(t, secretA, 201, deferredBody("bound", `"id":"next","debounce":{"key":"k","period":"1h"}`))
	require.Equal(t, api.StatusDeferred, next.Status)
	require.NotEqual(t, runID, next.RunID, "a new window")
	require.Equal(t, deferred.DefaultDebounceMaxStarts+1, b.count(t, 0, `SELECT count(*) FROM deferred_starts`))
	require.Equal(t, 2, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	requireExactCounts(t, b)
}

// Debounce starts from a few goroutines, janitors firing and cancels,
// racing: one tenant at its limit is refused every start (joins included)
// while the other's starts are admitted as its limit allows, no count
// passes the limit and every count equals a recount.
func TestDeferredRacingDebounceKeepsCountsExact(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: eightTenants(t)})
	putAdmission(t, b, `{"algorithm": "static", "tfm": 1}`) // limit 16
	fillRuns(t, b, tenantOn[0], 12)                         // room for four windows
	fillRuns(t, b, tenantOn[1], 15)
	full := b.startRun(t, secretB, 201, deferredBody("race", `"id":"full","debounce":{"key":"k0","period":"1h"}`))
	require.Equal(t, api.StatusDeferred, full.Status) // tenantOn[1] is at its limit from here on

	const (
		writers = 3
		each    = 15
	)
	type tally struct {
		mu       sync.Mutex
		accepted []string
		refused  int
	}
	var tallies [2]tally
	secrets := [2]string{secretA, secretB}
	g := pool.New().WithErrors()
	for w := range writers {
		for tn := range 2 {
			c := b.client(t, secrets[tn])
			g.Go(func() error {
				for i := range each {
					id := fmt.Sprintf("r%d-%d", w, i)
					st, err := c.Start(b.ctx, "echo", "race", i, client.StartOptions{ID: id,
						Debounce: client.Debounce(fmt.Sprint("k", i%3), time.Hour, 0)})
					tl := &tallies[tn]
					tl.mu.Lock()
					switch {
					case errors.Is(err, client.ErrOverLimit):
						tl.refused++
					case err == nil && st.Created:
						tl.accepted = append(tl.accepted, id)
					}
					tl.mu.Unlock()
					if err != nil && !errors.Is(err, client.ErrOverLimit) {
						return fmt.Errorf("start %s: %w", id, err)
					}
				}
				return nil
			})
		}
	}
	g.Go(func() error {
		// A janitor on each shard, firing every open window.
		for range 10 {
			for shard, db := range b.dbs {
				if _, err := deferred.Fire(b.ctx, db, deferred.FireOptions{Shard: shard, Now: time.Now().Add(2 * time.Hour)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	cancels := b.client(t, secretA)
	g.Go(func() error {
		for range 10 {
			tl := &tallies[0]
			tl.mu.Lock()
			var id string
			if n := len(tl.accepted); n > 0 {
				id = tl.accepted[n/2]
			}
			tl.mu.Unlock()
			if id == "" {
				continue
			}
			if _, err := cancels.Cancel(b.ctx, id); err != nil && !errors.Is(err, client.ErrConflict) {
				return fmt.Errorf("cancel %s: %w", id, err)
			}
		}
		return nil
	})
	require.NoError(t, g.Wait())

	require.NotEmpty(t, tallies[0].accepted, "the tenant under its limit was admitted")
	require.Empty(t, tallies[1].accepted, "the tenant at its limit was refused every start, joins included")
	require.Equal(t, writers*each, tallies[1].refused)
	for _, tn := range tenantOn {
		require.LessOrEqual(t, runsOf(t, b, tn), 16, tn)
	}
	requireExactCounts(t, b)
}
